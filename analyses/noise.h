// --tolerance auto: the plain step's own noise, measured, and the checkpointed step judged against it.
#pragma once

#include <string>
#include <vector>

#include "harness/runner/runner.h"

namespace ckcheck {

/// Runs the plain step `reruns` more times from the runner's start (the last of them with another
/// intra-op thread count) and measures, with `first` (a rerun already made), each tensor's noise
/// against `reference`.
NoiseEnvelope measure_noise(Runner& runner, const StepRecord& reference, const StepRecord& first, int reruns);

/// Each differing diff that lies within NoiseEnvelope::kFactor times its tensor's noise counts as equal (a
/// tensor that did not vary has no noise: any difference stays one). Missing sides, shapes, dtypes
/// and NaN or Inf never do. Their names go to noise.within.
void within_noise(std::vector<TensorDiff>& diffs, NoiseEnvelope& noise);

/// The tensors whose noise goes beyond rounding (kAutoEpsilons epsilons of their own largest
/// magnitude): then the plain step is not repeatable, and nothing can be judged against it.
std::vector<std::string> noise_beyond_rounding(const NoiseEnvelope& noise, const StepRecord& reference);

}  // namespace ckcheck
