// What takes part in every training step the Runner runs, besides the model and the checkpoint.
// Data parallelism (DataParallel) is one: it shards the batch, seeds each rank on its own, sees
// each gradient as it is ready and reduces them at the end of the step. The Runner calls a
// participant at these points and never asks what it is; the default one takes no part.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "ckcheck/model.h"

namespace ckcheck {

class StepParticipant {
 public:
  virtual ~StepParticipant() = default;
  /// Added to the run's seed before the step: each rank draws its own random stream.
  virtual uint64_t seed_offset() const { return 0; }
  /// How many of this process's batches make the global one.
  virtual int64_t batch_multiple() const { return 1; }
  /// This process's rows of a tensor of the global batch (inputs, upstream gradients).
  virtual torch::Tensor shard(const torch::Tensor& global) const { return global; }
  /// Whether it needs each parameter's gradient as it is ready (a hook per parameter).
  virtual bool watches_gradients() const { return false; }
  /// Before each backward.
  virtual void begin_backward(const NamedTensors& params) {}
  /// A parameter's gradient hook fired with `grad`.
  virtual void gradient_ready(size_t index, const torch::Tensor& grad) {}
  /// After the step's backwards, before its gradients are recorded.
  virtual void end_step(const NamedTensors& params) {}
  /// How often each parameter's gradient hook fired in the last backward, where an engine fires
  /// hooks of its own in place of the parameters' (FSDP2's on its shards); nullopt otherwise.
  virtual std::optional<std::vector<int64_t>> hook_fires() const { return std::nullopt; }
  /// Around every run of steps it takes part in (end_run also when a step threw).
  virtual void begin_run() {}
  virtual void end_run() {}
};

}  // namespace ckcheck
