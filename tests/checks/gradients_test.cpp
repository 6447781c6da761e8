// The gradients check on hand-built records (no model runs): a difference by rounding alone --
// every recompute reproduced its forward, the loss and outputs are equal, the gradient is within
// reassociation error of its scale -- warns with cause accumulation-order; anything more fails.
#include <gtest/gtest.h>

#include "checks/check.h"
#include "tests/support/records.h"

namespace ckcheck {
namespace {

struct Records : testing::HandBuiltRecords {
  // Reference and checkpointed steps that agree on the loss; the checkpointed gradient of
  // "w" is the reference's plus `delta` at one element. A recomputed call per unit, each of which
  // reproduced its forward's output (the first one, or not).
  Records(double delta, bool recompute_exact = true, double loss_delta = 0.0) {
    auto w = torch::linspace(-1.0, 1.0, 64, torch::kFloat);
    auto w2 = w.clone();
    w2[7] += delta;
    records.reference.tensors = {{"loss", "loss", 1, torch::tensor(0.5, torch::kDouble)},
                                 {"w", "param-grad", 1, w}};
    records.checkpointed.tensors = {{"loss", "loss", 1, torch::tensor(0.5 + loss_delta, torch::kDouble)},
                                    {"w", "param-grad", 1, w2}};
    for (const auto& unit : plan.units) {
      CallEvidence call;
      call.site = Plan::unit_label(unit);
      call.recomputed = true;
      call.grad_all_zero = false;
      TensorDiff out;
      out.equal = recompute_exact || unit != plan.units.front();
      call.output_diffs = {out};
      records.checkpointed.calls.push_back(call);
    }
  }

  CheckResult run() const { return HandBuiltRecords::run(*make_check("gradients")); }
};

bool has_cause(const CheckResult& r, Cause c) {
  return std::any_of(r.findings.begin(), r.findings.end(), [c](const Finding& f) { return f.cause == c; });
}

TEST(GradientsCheck, RoundingFromAnotherSummationOrderWarns) {
  Records rec(8 * 1.2e-7);  // a few epsilons of the gradient's largest value (1)
  const auto r = rec.run();
  EXPECT_EQ(r.status, Status::kWarn) << r;
  EXPECT_TRUE(has_cause(r, Cause::kAccumulationOrder)) << r;
}

TEST(GradientsCheck, MoreThanRoundingFails) {
  const auto r = Records(1e-2).run();
  EXPECT_EQ(r.status, Status::kFail) << r;
  EXPECT_FALSE(has_cause(r, Cause::kAccumulationOrder)) << r;
}

TEST(GradientsCheck, RoundingWithARecomputeThatDiffersFails) {
  const auto r = Records(8 * 1.2e-7, /*recompute_exact=*/false).run();
  EXPECT_EQ(r.status, Status::kFail) << r;
  EXPECT_FALSE(has_cause(r, Cause::kAccumulationOrder)) << r;
}

TEST(GradientsCheck, RoundingWithADifferentLossFails) {
  const auto r = Records(8 * 1.2e-7, true, 1e-9).run();
  EXPECT_EQ(r.status, Status::kFail) << r;
  EXPECT_FALSE(has_cause(r, Cause::kAccumulationOrder)) << r;
}

TEST(GradientsCheck, EqualGradientsPass) {
  const auto r = Records(0.0).run();
  EXPECT_EQ(r.status, Status::kPass) << r;
}

}  // namespace
}  // namespace ckcheck
