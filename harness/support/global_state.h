// Snapshots of the process-wide state a recompute must see as the forward saw it: the default
// random generators and the autocast settings.
#pragma once

#include <ATen/core/MT19937RNGEngine.h>
#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include <memory>
#include <optional>
#include <vector>

namespace ckcheck {

/// The state of the default CPU generator and of the default generator of every initialised CUDA
/// device (all of them, not only those of the tensors at hand: a module may draw on any device).
struct RngState {
  torch::Tensor cpu;
  std::vector<std::pair<int, torch::Tensor>> cuda;  // device index, state

  static RngState capture();
  void restore() const;
  bool operator==(const RngState& other) const;
  bool operator!=(const RngState& other) const { return !(*this == other); }
};

/// What ckcheck::checkpoint forks around a recompute: the same generators as RngState, the CPU one
/// copied as it holds its state (its Mersenne Twister engine and cached normal samples) instead of
/// serialised to a tensor and parsed back -- the same replay at a fraction of the cost. Not
/// comparable: RngState is what evidence compares.
class RngFork {
 public:
  static RngFork capture();
  void restore() const;
  /// restore(), leaving the CPU generator as it is where `now`, captured just before with nothing
  /// drawn since, shows it already holds this state (no random op ran in between: a model without
  /// dropout). CUDA states are put back in any case.
  void restore_over(const RngFork& now) const;

 private:
  bool same_cpu_state(const RngFork& other) const;
  void restore_cuda() const;
  // Engines are 2.5 KB, past the allocator's small-size caches: each thread keeps a few released
  // ones for reuse rather than have every call allocate and free one.
  struct Recycle {
    void operator()(at::mt19937* engine) const;
  };
  std::unique_ptr<at::mt19937, Recycle> cpu_engine_;
  std::optional<float> cpu_next_float_;
  std::optional<double> cpu_next_double_;
  std::vector<std::pair<int, torch::Tensor>> cuda_;  // device index, state
};

/// Seeds the CPU generator and every CUDA generator, like torch.manual_seed.
void seed_all(uint64_t seed);

/// Number of CUDA devices (0 in a CPU build or without a GPU), queried once.
int cuda_device_count();

/// The autocast settings of the calling thread.
struct AutocastState {
  bool cpu_enabled = false;
  bool cuda_enabled = false;
  c10::ScalarType cpu_dtype = c10::kBFloat16;
  c10::ScalarType cuda_dtype = c10::kHalf;
  bool cache_enabled = true;

  static AutocastState capture();
  bool any_enabled() const { return cpu_enabled || cuda_enabled; }
  bool operator==(const AutocastState& other) const;
};

/// Puts an autocast state in place for a scope and restores the previous one after it, with the
/// nesting and cache bookkeeping of torch.autocast's enter and exit.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& state);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState previous_;
};

}  // namespace ckcheck
