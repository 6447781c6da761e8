// Comparing a reference tensor with its checkpointed counterpart.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <ostream>
#include <string>

namespace ckcheck {

/// When two tensors count as equal.
///   bitwise            every element equal; NaN equals NaN in the same place (+0 equals -0)
///   rtol=R,atol=A      |checkpointed - reference| <= A + R * |reference|, as torch.allclose
///   ulp=N              at most N units in the last place apart, in the tensor's own dtype
///   auto               a step's tensors within the noise of the plain step rerun (the session
///                      measures it: NoiseEnvelope); other values within the reordering error of a
///                      sum on their own scale (kAutoEpsilons epsilons of their largest magnitude)
struct Tolerance {
  enum class Kind { kBitwise, kClose, kUlp, kAuto };
  Kind kind = Kind::kBitwise;
  double rtol = 0.0;
  double atol = 0.0;
  int64_t ulp = 0;

  /// Parses the forms above; throws UsageError naming them.
  static Tolerance parse(const std::string& text);
  std::string text() const;
  bool bitwise() const { return kind == Kind::kBitwise; }
  bool automatic() const { return kind == Kind::kAuto; }
};

/// Machine epsilon of a floating dtype (0 for other dtypes).
double machine_epsilon(c10::ScalarType dtype);

/// Under --tolerance auto, how many epsilons of a value's own largest magnitude rounding may move it
/// where no noise was measured (a unit's outputs in the determinism probe).
constexpr double kAutoEpsilons = 1024.0;

/// How a checkpointed tensor differs from its reference.
struct TensorDiff {
  std::string name;
  std::string kind;  // loss, output, param-grad, input-grad, buffer
  int step = 1;
  bool equal = true;
  double max_abs = 0.0;
  double max_rel = 0.0;
  int64_t max_ulp = 0;
  int64_t mismatched = 0;
  int64_t numel = 0;
  int64_t first_index = -1;  // flat index of the first mismatch
  int64_t nonfinite_reference = 0;
  int64_t nonfinite_checkpointed = 0;
  std::string missing = "none";  // none, reference, checkpointed (the side that has no tensor)
  std::string note;              // a shape or dtype difference, in words
  // A partial gradient's parameter and micro-batch (TensorRecord's), for the checks.
  std::string parameter;
  int64_t micro_batch = 0;

  bool operator==(const TensorDiff& o) const;
};

std::ostream& operator<<(std::ostream& os, const TensorDiff& d);

/// Compares element by element (after moving both to the CPU). Undefined tensors are "missing".
TensorDiff compare_tensors(const torch::Tensor& reference, const torch::Tensor& checkpointed,
                           const Tolerance& tolerance);

/// Distance in units in the last place between two finite values of a floating dtype, computed
/// on their bit patterns in that dtype (so a bf16 ULP is a bf16 ULP).
torch::Tensor ulp_distance(const torch::Tensor& a, const torch::Tensor& b);

/// A cheap content fingerprint (FNV-1a over the bytes of a contiguous CPU copy), for telling
/// whether a tensor changed without keeping a copy of it.
uint64_t fingerprint(const torch::Tensor& t);

}  // namespace ckcheck
