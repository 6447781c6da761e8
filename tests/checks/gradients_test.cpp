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

// The float64 rerun's difference of one tensor (its plain value's largest magnitude `scale`).
void rerun_shows(Records& rec, const std::string& name, const std::string& kind, double max_abs, double scale) {
  if (!rec.records.precision) rec.records.precision.emplace();
  rec.records.precision->diffs.push_back({name, kind, 1, max_abs, scale});
}

// A gradient whose true value is zero (BART's attention key bias) keeps the rounding noise of the
// terms it was summed from, far beyond its own near-zero maximum: rounding when the float64 rerun
// shows it shrink with the precision; without a rerun it is judged on its own scale, and fails.
TEST(GradientsCheck, AGradientWhoseTrueValueIsZeroIsRoundingOnlyByTheFloat64Rerun) {
  for (const bool rerun : {true, false}) {
    Records rec(8 * 1.2e-7);
    auto zero = torch::zeros({4}, torch::kFloat);
    zero[1] = 3e-15;
    auto noisy = zero.clone();
    noisy[1] = -2e-14;
    rec.records.reference.tensors.push_back({"bias", "param-grad", 1, zero});
    rec.records.checkpointed.tensors.push_back({"bias", "param-grad", 1, noisy});
    if (rerun) {
      rerun_shows(rec, "w", "param-grad", 1e-15, 1.0);
      rerun_shows(rec, "bias", "param-grad", 4e-23, 5e-24);
    }
    const auto r = rec.run();
    EXPECT_EQ(r.status, rerun ? Status::kWarn : Status::kFail) << r;
    EXPECT_EQ(has_cause(r, Cause::kAccumulationOrder), rerun) << r;
    EXPECT_EQ(r.details["rounding"]["rule"], rerun ? "float64" : "own-scale") << r;
  }
}

// A gradient small beside the step's others (a router's, fed by a small auxiliary loss) is judged
// on its own size: a lost term of 5% of it is within 1024 epsilons of the step's largest gradient,
// and must fail.
TEST(GradientsCheck, AGradientSmallBesideTheOthersIsJudgedOnItsOwnScale) {
  Records rec(8 * 1.2e-7);
  auto gate = torch::full({8}, 1e-3, torch::kFloat);
  auto lost = gate.clone();
  lost[2] += 5e-5;  // 5% of the gate's own value; 1e-4 of the step's largest gradient (1)
  rec.records.reference.tensors.push_back({"gate", "param-grad", 1, gate});
  rec.records.checkpointed.tensors.push_back({"gate", "param-grad", 1, lost});
  const auto r = rec.run();
  EXPECT_EQ(r.status, Status::kFail) << r;
  EXPECT_FALSE(has_cause(r, Cause::kAccumulationOrder)) << r;
  EXPECT_EQ(r.details["rounding"]["tensor"], "gate") << r;
}

// The float64 rerun decides both ways: a difference far beyond what a sum reorders in float32 that
// shrinks with the precision is rounding; one of a few epsilons that keeps its size is not.
TEST(GradientsCheck, TheFloat64RerunDecidesWhatSizeAloneCannot) {
  {
    Records rec(3e-3);  // 25000 epsilons of w's largest value
    rerun_shows(rec, "w", "param-grad", 6e-12, 1.0);
    const auto r = rec.run();
    EXPECT_EQ(r.status, Status::kWarn) << r;
    EXPECT_TRUE(has_cause(r, Cause::kAccumulationOrder)) << r;
  }
  {
    Records rec(8 * 1.2e-7);  // a few epsilons, as rounding would be; in float64 the same size
    rerun_shows(rec, "w", "param-grad", 9.5e-7, 1.0);
    const auto r = rec.run();
    EXPECT_EQ(r.status, Status::kFail) << r;
    EXPECT_FALSE(has_cause(r, Cause::kAccumulationOrder)) << r;
    EXPECT_EQ(r.details["rounding"]["rule"], "float64") << r;
  }
}

// The loss and outputs are values rounding can explain too where the float64 rerun shows them
// shrink; without a rerun an eager step's loss must be equal.
TEST(GradientsCheck, ALossThatShrinksInFloat64IsRounding) {
  Records rec(8 * 1.2e-7, true, 2e-9);
  rec.same("output[0]", "output", torch::ones({2}, torch::kFloat));  // the loss's precision: float32
  rerun_shows(rec, "w", "param-grad", 1e-15, 1.0);
  rerun_shows(rec, "loss", "loss", 3e-18, 0.5);
  const auto r = rec.run();
  EXPECT_EQ(r.status, Status::kWarn) << r;
  EXPECT_TRUE(has_cause(r, Cause::kAccumulationOrder)) << r;
}

TEST(GradientsCheck, AZeroGradientThatMovesBeyondRoundingOfTheStepFails) {
  Records rec(8 * 1.2e-7);
  auto zero = torch::zeros({4}, torch::kFloat);
  auto moved = zero.clone();
  moved[1] = 1e-3;  // far beyond 1024 epsilons of the step's largest gradient (1)
  rec.records.reference.tensors.push_back({"bias", "param-grad", 1, zero});
  rec.records.checkpointed.tensors.push_back({"bias", "param-grad", 1, moved});
  const auto r = rec.run();
  EXPECT_EQ(r.status, Status::kFail) << r;
  EXPECT_FALSE(has_cause(r, Cause::kAccumulationOrder)) << r;
}

// An output that carried a graph in the plain step and none with checkpointing, while a
// checkpointed forward ran without autograd: what was kept from inside it has no gradient.
TEST(GradientsCheck, AnOutputThatLostItsGraphInANoGradForwardIsReentrantNoGrad) {
  Records rec(1e-2);
  rec.records.reference.tensors.push_back({"output[1]", "output", 1, torch::ones({2}), true});
  rec.records.checkpointed.tensors.push_back({"output[1]", "output", 1, torch::ones({2}), false});
  rec.records.checkpointed.calls.front().forward_no_grad = true;
  const auto r = rec.run();
  EXPECT_EQ(r.status, Status::kFail) << r;
  ASSERT_TRUE(has_cause(r, Cause::kReentrantNoGrad)) << r;
  EXPECT_EQ(r.findings.front().site, Plan::unit_label(rec.plan.units.front())) << r;
}

TEST(GradientsCheck, AnOutputWithItsGraphKeptIsNotReentrantNoGrad) {
  Records rec(1e-2);
  rec.records.reference.tensors.push_back({"output[1]", "output", 1, torch::ones({2}), true});
  rec.records.checkpointed.tensors.push_back({"output[1]", "output", 1, torch::ones({2}), true});
  rec.records.checkpointed.calls.front().forward_no_grad = true;
  const auto r = rec.run();
  EXPECT_EQ(r.status, Status::kFail) << r;
  EXPECT_FALSE(has_cause(r, Cause::kReentrantNoGrad)) << r;
}

// Every recompute reproduced its forward and the hooks fired alike, yet a gradient differs after a
// forward run without autograd: a tensor made inside it and used outside (an auxiliary loss in a
// list) lost its graph. A hook that fired again is the other way, so then nothing is named.
TEST(GradientsCheck, AFaithfulNoGradForwardWithHooksAlikeIsReentrantNoGradUnlessAHookFiredAgain) {
  for (const int64_t fires : {1, 2}) {
    Records rec(1e-2);
    rec.records.checkpointed.calls.front().forward_no_grad = true;
    rec.records.reference.hooks = {{"w", 1, 1, 1}};
    rec.records.checkpointed.hooks = {{"w", 1, fires, 1}};
    const auto r = rec.run();
    EXPECT_EQ(r.status, Status::kFail) << r;
    EXPECT_EQ(has_cause(r, Cause::kReentrantNoGrad), fires == 1) << r;
    EXPECT_EQ(has_cause(r, Cause::kUnexplained), fires == 2) << r;
  }
}

// PyTorch's own errors in the checkpointed step, by their messages (each also triggered for real
// in tests/eager/test_fidelity.py).
TEST(GradientsCheck, PytorchErrorsInTheCheckpointedStepNameTheirCause) {
  struct Row {
    std::string error;
    Cause cause;
  };
  const std::vector<Row> rows = {
      {"RuntimeError: one of the variables needed for gradient computation has been modified by an inplace "
       "operation: [torch.FloatTensor [4, 8]], which is output 0 of AddmmBackward0, is at version 1; expected "
       "version 0 instead.",
       Cause::kInPlace},
      {"RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn", Cause::kMissingGrad},
      {"CheckpointError: torch.utils.checkpoint: Recomputed values for the following tensors have different metadata "
       "than during the forward pass.\ntensor at position 2:\nsaved metadata: {'shape': torch.Size([4, 8]), "
       "'dtype': torch.float32, 'device': device(type='cpu')}\nrecomputed metadata: {'shape': torch.Size([8, 8]), "
       "'dtype': torch.float32, 'device': device(type='cpu')}",
       Cause::kStateful},
      {"CheckpointError: torch.utils.checkpoint: Recomputed values for the following tensors have different metadata "
       "than during the forward pass.\ntensor at position 2:\nsaved metadata: {'shape': torch.Size([4, 8]), "
       "'dtype': torch.float32, 'device': device(type='cpu')}\nrecomputed metadata: {'shape': torch.Size([4, 8]), "
       "'dtype': torch.bfloat16, 'device': device(type='cpu')}",
       Cause::kAutocast},
      {"CheckpointError: torch.utils.checkpoint: A different number of tensors was saved during the original forward "
       "and recomputation.",
       Cause::kStateful},
      {"CheckpointError: torch.utils.checkpoint: trying to save more tensors during recomputation than during the "
       "original forward pass.",
       Cause::kStateful},
  };
  for (const auto& row : rows) {
    Records rec(0.0);
    rec.records.checkpointed.error = row.error;
    const auto r = rec.run();
    EXPECT_EQ(r.status, Status::kFail) << row.error << r;
    EXPECT_TRUE(has_cause(r, row.cause)) << row.error << r;
  }
  // Negative control: a message PyTorch's table does not know stays an error, with its text.
  Records rec(0.0);
  rec.records.checkpointed.error = "RuntimeError: something else went wrong";
  const auto r = rec.run();
  EXPECT_EQ(r.status, Status::kError) << r;
}

// A recompute that differs from its forward, at a site that repeats identically on its own: when
// the forward ran without autograd and the probe's call with autograd gives other values, the
// cause is the grad mode; with autograd giving the same values (or a forward run with autograd)
// nothing explains it.
TEST(GradientsCheck, ARecomputeThatDiffersOnlyWithAutogradOnIsGradModeAfterANoGradForward) {
  for (const bool values_differ : {true, false}) {
    for (const bool forward_no_grad : {true, false}) {
      Records rec(1e-2, /*recompute_exact=*/false);
      auto& call = rec.records.checkpointed.calls.front();
      call.forward_no_grad = forward_no_grad;
      UnitProbe p;
      p.site = call.site;
      p.grad_mode_equal = !values_differ;
      p.grad_mode_diff = values_differ ? 6e-7 : 0.0;
      rec.records.probes = std::vector<UnitProbe>{p};
      const auto r = rec.run();
      EXPECT_EQ(r.status, Status::kFail) << r;
      const bool named = values_differ && forward_no_grad;
      EXPECT_EQ(has_cause(r, Cause::kGradMode), named) << values_differ << forward_no_grad << r;
      EXPECT_EQ(has_cause(r, Cause::kUnexplained), !named) << values_differ << forward_no_grad << r;
    }
  }
}

TEST(GradientsCheck, EqualGradientsPass) {
  const auto r = Records(0.0).run();
  EXPECT_EQ(r.status, Status::kPass) << r;
}

}  // namespace
}  // namespace ckcheck
