#include "harness/model/random_input.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "harness/support/errors.h"
#include "harness/support/text.h"

namespace ckcheck {

namespace {

const std::vector<std::pair<std::string, c10::ScalarType>>& dtype_names() {
  static const std::vector<std::pair<std::string, c10::ScalarType>> names = {
      {"float32", torch::kFloat}, {"float64", torch::kDouble}, {"float16", torch::kHalf}, {"bfloat16", torch::kBFloat16},
      {"int64", torch::kLong},    {"int32", torch::kInt},      {"float", torch::kFloat},  {"long", torch::kLong}};
  return names;
}

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  std::string cur;
  for (char c : text + ",") {
    if (c != ',' && c != 'x') {
      cur += c;
      continue;
    }
    const auto v = parse_int(cur);
    if (!v || *v < 1 || *v > (int64_t{1} << 31)) {
      throw FieldError("input_shape", fmt::format("@input_shape '{}': give sizes of at least 1, as 2,3,224,224", text));
    }
    shape.push_back(*v);
    cur.clear();
  }
  double elements = 1;
  for (auto n : shape) elements *= static_cast<double>(n);
  if (elements > static_cast<double>(int64_t{1} << 31)) {
    throw FieldError("input_shape",
                     fmt::format("@input_shape '{}' asks for {:g} elements; at most 2^31 are allowed", text, elements));
  }
  return shape;
}

std::pair<double, double> parse_range(const std::string& text) {
  const auto comma = text.find(',');
  const auto lo = parse_double(text.substr(0, comma));
  const auto hi = parse_double(comma == std::string::npos ? "" : text.substr(comma + 1));
  if (!lo || !hi) throw FieldError("input_range", fmt::format("@input_range '{}': give LO,HI, as 0,1000", text));
  if (!(*hi > *lo)) throw FieldError("input_range", fmt::format("@input_range '{}': HI must be above LO", text));
  return {*lo, *hi};
}

}  // namespace

RandomInput RandomInput::parse(const std::string& shape, const std::string& dtype, const std::string& range) {
  RandomInput in;
  if (!shape.empty()) in.shape = parse_shape(shape);
  const auto& names = dtype_names();
  const auto dt = std::find_if(names.begin(), names.end(), [&](const auto& n) { return n.first == dtype; });
  if (dt == names.end()) {
    throw FieldError("input_dtype",
                     fmt::format("@input_dtype '{}'; valid: float32, float64, float16, bfloat16, int64, int32", dtype));
  }
  in.dtype = dt->second;
  if (!range.empty()) in.range = parse_range(range);
  if (in.given() && !c10::isFloatingType(in.dtype) && !in.range) {
    throw FieldError("input_range", "integer inputs (token ids) need @input_range LO,HI, as 0,1000");
  }
  return in;
}

torch::Tensor RandomInput::make(uint64_t seed) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x5eedc0ffeeull);
  if (!c10::isFloatingType(dtype)) {
    return torch::randint(static_cast<int64_t>(range->first), static_cast<int64_t>(range->second), shape, gen,
                          torch::TensorOptions().dtype(dtype));
  }
  auto x = range ? torch::rand(shape, gen) * (range->second - range->first) + range->first : torch::randn(shape, gen);
  return x.to(dtype);
}

std::string RandomInput::shape_text() const { return fmt::format("{}", fmt::join(shape, ",")); }

std::string RandomInput::dtype_text() const {
  for (const auto& [name, type] : dtype_names()) {
    if (type == dtype) return name;
  }
  return c10::toString(dtype);
}

std::string RandomInput::range_text() const { return range ? fmt::format("{:g},{:g}", range->first, range->second) : ""; }

}  // namespace ckcheck
