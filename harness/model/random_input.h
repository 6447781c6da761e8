// A seeded random input described by three texts (--input-shape, --input-dtype, --input-range),
// parsed once into typed values: the TorchScript models and the Python models make their inputs
// from the same parse, with the same rules.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ckcheck {

struct RandomInput {
  std::vector<int64_t> shape;  // empty: no random input was asked for
  c10::ScalarType dtype = c10::kFloat;
  std::optional<std::pair<double, double>> range;  // [lo, hi): integers (token ids) or uniform floats

  /// Parses the texts ("2,3,224,224" or "2x3", "float32", "0,1000"); throws FieldError naming
  /// input_shape, input_dtype or input_range. An empty shape gives no input; an integer dtype needs
  /// a range.
  static RandomInput parse(const std::string& shape, const std::string& dtype, const std::string& range);

  bool given() const { return !shape.empty(); }
  /// The tensor of this seed: uniform in the range, standard normal without one (floats).
  torch::Tensor make(uint64_t seed) const;

  /// The texts again, canonical ("2,3", "float32", "0,1000"), for a model's options.
  std::string shape_text() const;
  std::string dtype_text() const;
  std::string range_text() const;  // "" without a range
};

}  // namespace ckcheck
