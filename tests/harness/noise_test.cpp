// --tolerance auto on hand-built steps: a checkpointed difference counts as noise within four times
// what the plain reruns showed for that tensor -- at least the step's largest relative noise at the
// tensor's own scale, where the step's tensors vary --, never in a step where nothing varied, never
// for a missing side or NaN; noise beyond rounding makes the plain step unrepeatable.
#include "analyses/noise.h"

#include <gtest/gtest.h>

namespace ckcheck {
namespace {

NoiseEnvelope envelope(double w_noise, double scale = 1.0) {
  NoiseEnvelope n;
  n.reruns = 4;
  n.entries = {{"w", "param-grad", 1, w_noise, scale}, {"b", "param-grad", 1, 0.0, scale}};
  return n;
}

TensorDiff differing(const std::string& name, double max_abs) {
  TensorDiff d;
  d.name = name;
  d.kind = "param-grad";
  d.equal = false;
  d.max_abs = max_abs;
  d.mismatched = 1;
  return d;
}

TEST(NoiseEnvelope, ADifferenceWithinFourTimesItsTensorsNoiseIsNoise) {
  auto n = envelope(1e-7);
  std::vector<TensorDiff> diffs = {differing("w", 3.9e-7), differing("b", 5e-7)};
  within_noise(diffs, n);
  EXPECT_TRUE(diffs[0].equal);
  EXPECT_FALSE(diffs[1].equal);  // beyond four times the step's relative noise at b's scale
  EXPECT_EQ(n.within, std::vector<std::string>{"w"});
}

TEST(NoiseEnvelope, ATensorTheRerunsReproducedGetsTheStepsRelativeNoise) {
  // b never varied in the reruns, but w (of the same step) did: a few reruns can miss b's noise.
  auto n = envelope(1e-7);
  std::vector<TensorDiff> diffs = {differing("b", 3.9e-7)};
  within_noise(diffs, n);
  EXPECT_TRUE(diffs[0].equal);
  // Where nothing in the step varied, nothing is noise.
  auto quiet = envelope(0.0);
  std::vector<TensorDiff> still = {differing("b", 1e-12)};
  within_noise(still, quiet);
  EXPECT_FALSE(still[0].equal);
}

TEST(NoiseEnvelope, BeyondFourTimesTheNoiseOrOnAMissingSideOrNanIsADifference) {
  auto n = envelope(1e-7);
  std::vector<TensorDiff> diffs = {differing("w", 4.1e-7)};
  within_noise(diffs, n);
  EXPECT_FALSE(diffs[0].equal);
  auto missing = differing("w", 1e-8);
  missing.missing = "checkpointed";
  auto nan = differing("w", 1e-8);
  nan.nonfinite_checkpointed = 1;
  std::vector<TensorDiff> more = {missing, nan};
  within_noise(more, n);
  EXPECT_FALSE(more[0].equal);
  EXPECT_FALSE(more[1].equal);
}

TEST(NoiseEnvelope, NoiseBeyondRoundingMakesThePlainStepUnrepeatable) {
  StepRecord reference;
  reference.tensors = {{"w", "param-grad", 1, torch::ones({4})}, {"b", "param-grad", 1, torch::ones({4})}};
  EXPECT_TRUE(noise_beyond_rounding(envelope(1e-5), reference).empty());  // 84 epsilons of 1
  EXPECT_EQ(noise_beyond_rounding(envelope(1e-2), reference), std::vector<std::string>{"w"});
}

}  // namespace
}  // namespace ckcheck
