// The gradient-accumulation check on hand-built records (no model runs): summed gradients that
// agree after the first micro-batch and differ later fail with cause accumulated-grad; a hook that
// fires twice in one micro-batch fails with hook-count; equal records pass; one micro-batch skips.
#include <gtest/gtest.h>

#include "checks/check.h"
#include "tests/support/records.h"

namespace ckcheck {
namespace {

struct Accumulated : testing::HandBuiltRecords {
  // Two micro-batches; the checkpointed gradient of blocks.1.fc1.weight is off by `after_first`
  // after micro-batch 1 and by `in_sum` in the sum; its hook fires `fires` times in micro-batch 2.
  Accumulated(double after_first, double in_sum, int64_t fires = 1) {
    config.accumulate = 2;
    const std::string name = "blocks.1.fc1.weight";
    auto g1 = torch::linspace(-1.0, 1.0, 16, torch::kFloat);
    auto sum = g1 * 2;
    records.reference.tensors = {{name + " after micro-batch 1", kPartialGradKind, 1, g1, false, name, 1},
                                 {name, "param-grad", 1, sum}};
    records.checkpointed.tensors = {{name + " after micro-batch 1", kPartialGradKind, 1, g1 + after_first, false, name, 1},
                                    {name, "param-grad", 1, sum + in_sum}};
    for (int64_t mb : {1, 2}) {
      records.reference.hooks.push_back({name, 1, 1, mb});
      records.checkpointed.hooks.push_back({name, 1, mb == 2 ? fires : 1, mb});
    }
  }

  CheckResult run() const { return HandBuiltRecords::run(*make_check("gradient-accumulation")); }
};

using testing::causes_of;

// The word the check brings to the vocabulary (declared in its own file).
Cause accumulated_grad() {
  const auto c = parse_cause("accumulated-grad");
  if (!c) throw std::runtime_error("the gradient-accumulation check declares no cause accumulated-grad");
  return *c;
}

TEST(GradientAccumulationCheck, ASumThatDiffersOnlyAfterTheFirstMicroBatchIsAccumulatedGrad) {
  const auto r = Accumulated(0.0, 0.5).run();
  EXPECT_EQ(r.status, Status::kFail) << r;
  ASSERT_EQ(causes_of(r), std::vector<Cause>{accumulated_grad()}) << r;
  EXPECT_EQ(r.findings[0].site, "blocks.1");
  EXPECT_EQ(r.findings[0].tensor, "blocks.1.fc1.weight");
}

TEST(GradientAccumulationCheck, ADifferenceFromTheFirstMicroBatchOnIsNotBlamedOnAccumulation) {
  const auto r = Accumulated(0.5, 0.5).run();
  EXPECT_EQ(r.status, Status::kFail) << r;
  const auto causes = causes_of(r);
  EXPECT_EQ(std::count(causes.begin(), causes.end(), accumulated_grad()), 0) << r;
}

TEST(GradientAccumulationCheck, AHookFiringTwiceInAMicroBatchFails) {
  const auto r = Accumulated(0.0, 0.0, /*fires=*/2).run();
  EXPECT_EQ(r.status, Status::kFail) << r;
  ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kHookCount}) << r;
  EXPECT_EQ(r.findings[0].details.at("micro_batch"), 2);
}

TEST(GradientAccumulationCheck, ASumThatDiffersByRoundingOnlyWarns) {
  // Two checkpointed calls adding their parts to .grad one by one: the same sum, another order.
  Accumulated a(0.0, 1.2e-7);
  for (const auto& unit : a.plan.units) {
    CallEvidence call;
    call.site = Plan::unit_label(unit);
    call.recomputed = true;
    call.output_diffs = {TensorDiff()};
    a.records.checkpointed.calls.push_back(call);
  }
  const auto r = a.run();
  EXPECT_EQ(r.status, Status::kWarn) << r;
  ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kAccumulationOrder}) << r;
}

TEST(GradientAccumulationCheck, EqualMicroBatchesPass) {
  const auto r = Accumulated(0.0, 0.0).run();
  EXPECT_EQ(r.status, Status::kPass) << r;
}

TEST(GradientAccumulationCheck, OneMicroBatchSkips) {
  Accumulated a(0.0, 0.5);
  a.config.accumulate = 1;
  EXPECT_EQ(a.run().status, Status::kSkip);
}

}  // namespace
}  // namespace ckcheck
