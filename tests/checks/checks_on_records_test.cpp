// Each check on hand-built records (no model runs): the evidence of its hazard fails it with its
// cause at the right site, and the same records without that evidence pass it (the negative
// control). The gradients and gradient-accumulation checks have their own files.
#include <gtest/gtest.h>

#include "checks/check.h"
#include "harness/runner/data_parallel.h"
#include "tests/support/records.h"

namespace ckcheck {
namespace {

using testing::causes_of;
using testing::HandBuiltRecords;

torch::Tensor values(double offset = 0.0) { return torch::linspace(-1.0, 1.0, 8, torch::kFloat) + offset; }

// --- buffers ---------------------------------------------------------------------------------

TEST(ChecksOnRecords, BuffersUpdatedTwiceFailAsBufferUpdateAtTheirUnit) {
  HandBuiltRecords h;
  h.same("blocks.0.fc1.weight", "param-grad", values());
  h.differ("blocks.1.norm.running_mean", state_kind::kBuffer, values(), values(0.5));
  h.call("blocks.0");
  h.call("blocks.1");
  const auto r = h.run(*make_check("buffers"));
  EXPECT_EQ(r.status, Status::kFail) << r;
  ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kBufferUpdate}) << r;
  EXPECT_EQ(r.findings[0].site, "blocks.1");
  EXPECT_EQ(r.findings[0].tensor, "blocks.1.norm.running_mean");
}

TEST(ChecksOnRecords, BuffersEqualAfterTheStepPass) {
  HandBuiltRecords h;
  h.same("blocks.1.norm.running_mean", state_kind::kBuffer, values());
  h.same("@blocks.1.calls", state_kind::kExtra, values());
  const auto r = h.run(*make_check("buffers"));
  EXPECT_EQ(r.status, Status::kPass) << r;
  EXPECT_EQ(r.details.at("compared"), 2);
}

TEST(ChecksOnRecords, BuffersOfAStatefulSiteNameTheStatefulCause) {
  HandBuiltRecords h;
  h.differ("@blocks.0.calls", state_kind::kExtra, values(), values(1.0));
  auto& p = h.probe("blocks.0");
  p.repeat_equal = false;
  p.changed_state = {"@blocks.0.calls"};
  auto& c = h.call("blocks.0");
  c.output_diffs[0].equal = false;
  const auto r = h.run(*make_check("buffers"));
  EXPECT_EQ(r.status, Status::kFail) << r;
  ASSERT_EQ(r.findings.size(), 1u) << r;
  EXPECT_NE(r.findings[0].cause, Cause::kBufferUpdate) << r;
  EXPECT_EQ(r.findings[0].tensor, "blocks.0.calls") << "the '@' of extra state is not shown";
}

// --- hooks -----------------------------------------------------------------------------------

TEST(ChecksOnRecords, AHookFiringTwiceFailsAsHookCount) {
  HandBuiltRecords h;
  h.records.reference.hooks = {{"blocks.0.fc1.weight", 1, 1, 1}, {"blocks.1.fc1.weight", 1, 1, 1}};
  h.records.checkpointed.hooks = {{"blocks.0.fc1.weight", 1, 1, 1}, {"blocks.1.fc1.weight", 1, 2, 1}};
  const auto r = h.run(*make_check("hooks"));
  EXPECT_EQ(r.status, Status::kFail) << r;
  ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kHookCount}) << r;
  EXPECT_EQ(r.findings[0].site, "blocks.1");
  EXPECT_EQ(r.findings[0].details.at("fires"), 2);
}

// A hook the plain step never reaches, fired once without a gradient under checkpointing (a
// checkpoint's node returns none for a parameter whose result the loss does not use): DDP takes
// it as unused either way. Fired with a gradient, or twice, it is a finding.
TEST(ChecksOnRecords, AHookFiredOnceWithoutAGradientWhereThePlainStepNeverReachesItPasses) {
  for (const auto& [fires, without, fails] : {std::tuple{1, 1, false}, {1, 0, true}, {2, 2, true}}) {
    HandBuiltRecords h;
    h.records.reference.hooks = {{"blocks.0.fc1.weight", 1, 1, 1}, {"blocks.0.aux.weight", 1, 0, 1}};
    h.records.checkpointed.hooks = {{"blocks.0.fc1.weight", 1, 1, 1}, {"blocks.0.aux.weight", 1, fires, 1, without}};
    const auto r = h.run(*make_check("hooks"));
    EXPECT_EQ(r.status, fails ? Status::kFail : Status::kPass) << fires << " fires, " << without << " without: " << r;
    if (fails) {
      ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kHookCount}) << r;
      EXPECT_EQ(r.findings[0].tensor, "blocks.0.aux.weight");
      EXPECT_NE(r.findings[0].message.find("the plain step never reaches it"), std::string::npos) << r;
    }
  }
}

TEST(ChecksOnRecords, HooksFiringAsInThePlainStepPass) {
  HandBuiltRecords h;
  h.records.reference.hooks = {{"blocks.0.fc1.weight", 1, 1, 1}, {"blocks.1.fc1.weight", 1, 1, 1}};
  h.records.checkpointed.hooks = h.records.reference.hooks;
  EXPECT_EQ(h.run(*make_check("hooks")).status, Status::kPass);
}

// --- input-mutation --------------------------------------------------------------------------

TEST(ChecksOnRecords, AnInputChangedBeforeTheRecomputeFailsAsInPlace) {
  HandBuiltRecords h;
  auto& c = h.call("blocks.1");
  c.versions_entry = {3};
  c.versions_exit = {3};
  c.versions_recompute = {4};
  const auto r = h.run(*make_check("input-mutation"));
  EXPECT_EQ(r.status, Status::kFail) << r;
  ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kInPlace}) << r;
  EXPECT_EQ(r.findings[0].site, "blocks.1");
  EXPECT_EQ(r.findings[0].tensor, "input 0");
}

TEST(ChecksOnRecords, StateChangedBeforeARecomputeThatDiffersFailsAsInPlace) {
  HandBuiltRecords h;
  auto& c = h.call("blocks.0");
  c.state_changed = {"blocks.0.fc1.weight"};
  c.output_diffs[0].equal = false;
  const auto r = h.run(*make_check("input-mutation"));
  ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kInPlace}) << r;
  EXPECT_EQ(r.findings[0].tensor, "blocks.0.fc1.weight");
}

TEST(ChecksOnRecords, InputsUnchangedUntilTheRecomputePass) {
  HandBuiltRecords h;
  auto& c = h.call("blocks.1");
  c.versions_entry = c.versions_exit = c.versions_recompute = {3};
  c.state_changed = {"blocks.1.fc1.weight"};  // changed, but the recompute still reproduced the forward
  EXPECT_EQ(h.run(*make_check("input-mutation")).status, Status::kPass);
}

// --- schedule ---------------------------------------------------------------------------------

// A unit that read state the forward rewrites: the interleaved steps, hand-built, with the
// interleaved checkpointed call's recompute reading the changed state where `differs`.
HandBuiltRecords interleaved_records(bool differs) {
  HandBuiltRecords h;
  h.call("blocks.0").state_rewritten = {"blocks.0.workspace"};
  StepRecord plain, ckpt;
  CallEvidence c = h.records.checkpointed.calls.front();
  c.state_rewritten.clear();
  if (differs) {
    c.state_changed = {"blocks.0.workspace"};
    c.output_diffs[0].equal = false;
  }
  ckpt.calls = {c};
  h.records.interleaved_reference = plain;
  h.records.interleaved_checkpointed = ckpt;
  TensorDiff d;
  d.name = "blocks.0.fc1.weight";
  d.kind = "param-grad";
  d.equal = !differs;
  d.max_abs = differs ? 0.5 : 0.0;
  h.records.interleaved_diffs = {d};
  return h;
}

TEST(ChecksOnRecords, InterleavedStepsThatDifferFailAsInPlaceNamingTheRewrittenState) {
  for (bool differs : {false, true}) {
    const auto h = interleaved_records(differs);
    const auto r = h.run(*make_check("schedule"));
    if (!differs) {
      EXPECT_EQ(r.status, Status::kPass) << r;
      continue;
    }
    ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kInPlace}) << r;
    EXPECT_EQ(r.findings[0].site, "blocks.0");
    EXPECT_EQ(r.findings[0].tensor, "blocks.0.workspace");
  }
}

TEST(ChecksOnRecords, ScheduleSkipsWhereNoUnitReadsRewrittenState) {
  HandBuiltRecords h;
  h.call("blocks.0");
  EXPECT_EQ(h.run(*make_check("schedule")).status, Status::kSkip);
}

// --- determinism -----------------------------------------------------------------------------

TEST(ChecksOnRecords, ASiteThatDiffersFromARestartFailsAsNonDeterministic) {
  HandBuiltRecords h;
  auto& p = h.probe("blocks.1");
  p.repeat_equal = p.restart_equal = false;
  p.max_abs_diff = 0.25;
  p.first_outputs = {values()};
  p.other_outputs = {values(0.25)};
  const auto r = h.run(*make_check("determinism"));
  EXPECT_EQ(r.status, Status::kFail) << r;
  ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kNonDeterministic}) << r;
  EXPECT_EQ(r.findings[0].site, "blocks.1");
}

TEST(ChecksOnRecords, ASiteThatRepeatsOnlyFromARestartFailsAsStateful) {
  HandBuiltRecords h;
  auto& p = h.probe("blocks.0");
  p.repeat_equal = false;
  p.changed_state = {"@blocks.0.calls"};
  const auto r = h.run(*make_check("determinism"));
  ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kStateful}) << r;
  EXPECT_EQ(r.findings[0].tensor, "blocks.0.calls");
}

// A unit that appends to a cache it is handed: named by its argument, with the fix for a cache, and
// a second call that throws (the cache of another length now) is that evidence too. The same probe
// without handed state keeps the generic stateful fix (the negative control).
TEST(ChecksOnRecords, AUnitThatChangesWhatItIsHandedIsStatefulNamingTheArgument) {
  for (bool handed : {false, true}) {
    HandBuiltRecords h;
    auto& p = h.probe("layers.0");
    p.repeat_equal = false;
    p.repeat_error = "RuntimeError: The size of tensor a (32) must match the size of tensor b (16)";
    if (handed) p.handed_state = {"past_key_values: DynamicCache"};
    const auto r = h.run(*make_check("determinism"));
    ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kStateful}) << r;
    const auto& f = r.findings[0];
    EXPECT_NE(f.message.find("a second call throws: RuntimeError: The size of tensor a"), std::string::npos) << f.message;
    EXPECT_EQ(f.tensor, handed ? "past_key_values: DynamicCache" : "");
    EXPECT_EQ(f.message.find("past_key_values: DynamicCache") != std::string::npos, handed) << f.message;
    EXPECT_EQ(f.hint.find("use_cache=False") != std::string::npos, handed) << f.hint;
  }
}

// A recompute that differed where the step shows nothing of it (a member the unit sets and reads
// again, added past every saved tensor) warns; the same unit with a gradient off fails.
TEST(ChecksOnRecords, AStatefulSiteWarnsWhenTheStepIsUnchangedAndFailsWhenItIsNot) {
  for (bool step_differs : {false, true}) {
    HandBuiltRecords h;
    h.same("blocks.0.fc1.weight", "param-grad", values());
    if (step_differs) h.differ("blocks.0.fc1.bias", "param-grad", values(), values(0.5));
    h.same("@blocks.0.prev", state_kind::kExtra, values());
    auto& p = h.probe("blocks.0");
    p.repeat_equal = false;
    const auto r = h.run(*make_check("determinism"));
    EXPECT_EQ(r.status, step_differs ? Status::kFail : Status::kWarn) << r;
    ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kStateful}) << r;
  }
}

TEST(ChecksOnRecords, SitesThatRepeatPassDeterminism) {
  HandBuiltRecords h;
  h.probe("blocks.0");
  h.probe("blocks.1");
  EXPECT_EQ(h.run(*make_check("determinism")).status, Status::kPass);
}

// --- rng -------------------------------------------------------------------------------------

TEST(ChecksOnRecords, ADrawNotReplayedFailsAsRngOnlyWithoutRngPreservation) {
  for (bool preserve : {false, true}) {
    HandBuiltRecords h;
    h.config.checkpoint.preserve_rng_state = preserve;
    h.probe("blocks.1").random_ops = {"aten::bernoulli_"};
    h.call("blocks.1").output_diffs[0].equal = false;
    const auto r = h.run(*make_check("rng"));
    if (preserve) {
      EXPECT_EQ(r.status, Status::kPass) << r;  // the control: the state is replayed
    } else {
      ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kRng}) << r;
      EXPECT_EQ(r.findings[0].site, "blocks.1");
    }
  }
}

TEST(ChecksOnRecords, APrivateGeneratorFailsAsRngEvenWithRngPreservation) {
  HandBuiltRecords h;
  auto& p = h.probe("blocks.0");
  p.random_ops = {"aten::randn"};
  p.private_generator = true;
  h.call("blocks.0").output_diffs[0].equal = false;
  const auto r = h.run(*make_check("rng"));
  ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kRng}) << r;
  EXPECT_EQ(r.findings[0].details.at("private_generator"), true);
}

// A unit that repeats from a restart (which puts NumPy's generator back) and changed no state of
// the model drew from NumPy: the rng check's, with its own hint, and no stateful finding. The
// control: with a member changed too, the repeat is the member's (stateful), not the generator's.
TEST(ChecksOnRecords, ADrawFromNumpysGeneratorIsRngAndStateBesideItIsStateful) {
  for (bool member_changed : {false, true}) {
    HandBuiltRecords h;
    h.differ("blocks.0.fc1.weight", "param-grad", values(), values(0.5));
    auto& p = h.probe("blocks.0");
    p.repeat_equal = false;
    p.host_generators = {"numpy.random"};
    if (member_changed) p.changed_state = {"@blocks.0.calls"};
    h.call("blocks.0").output_diffs[0].equal = false;
    const auto rng = h.run(*make_check("rng"));
    const auto det = h.run(*make_check("determinism"));
    if (member_changed) {
      EXPECT_EQ(rng.status, Status::kPass) << rng;
      ASSERT_EQ(causes_of(det), std::vector<Cause>{Cause::kStateful}) << det;
      EXPECT_NE(det.findings[0].message.find("numpy.random"), std::string::npos) << det;
    } else {
      EXPECT_EQ(rng.status, Status::kFail) << rng;
      ASSERT_EQ(causes_of(rng), std::vector<Cause>{Cause::kRng}) << rng;
      EXPECT_EQ(rng.findings[0].tensor, "numpy.random");
      EXPECT_NE(rng.findings[0].hint.find("torch.randn"), std::string::npos) << rng;
      EXPECT_EQ(det.status, Status::kPass) << det;
      EXPECT_TRUE(det.findings.empty()) << det;
    }
  }
}

// --- autocast --------------------------------------------------------------------------------

TEST(ChecksOnRecords, AnOpRecomputedInAnotherDtypeFailsAsAutocast) {
  for (bool differs : {true, false}) {
    HandBuiltRecords h;
    h.config.amp = Amp::kBf16;
    auto& c = h.call("blocks.0");
    c.forward_ops = c.recompute_ops = {"aten::linear", "aten::relu"};
    c.forward_dtypes = {"BFloat16", "BFloat16"};
    c.recompute_dtypes = {differs ? "Float" : "BFloat16", "BFloat16"};
    c.forward_autocast = {"cpu:BFloat16", "cpu:BFloat16"};
    c.recompute_autocast = {differs ? "off" : "cpu:BFloat16", "cpu:BFloat16"};
    const auto r = h.run(*make_check("autocast"));
    if (!differs) {
      EXPECT_EQ(r.status, Status::kPass) << r;
      continue;
    }
    EXPECT_EQ(r.status, Status::kFail) << r;
    ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kAutocast}) << r;
    EXPECT_EQ(r.findings[0].tensor, "aten::linear");
    EXPECT_EQ(r.findings[0].details.at("op_index"), 0);
  }
}

// The recompute takes another op under the same autocast state (a cache the forward filled: an
// empty tensor then, a cat now): another path, which the other checks judge, not a precision
// change. The same divergence fails where the recompute also lost autocast, or where the other op
// is a cast (a recompute that upcasts by hand).
TEST(ChecksOnRecords, AnotherOpUnderTheSameAutocastStateIsNoAutocastFindingUnlessACast) {
  enum Variant { kPath, kAutocastLost, kCast };
  for (Variant v : {kPath, kAutocastLost, kCast}) {
    HandBuiltRecords h;
    h.config.amp = Amp::kBf16;
    auto& c = h.call("blocks.0");
    c.forward_ops = {"aten::linear", "aten::empty", "aten::matmul"};
    c.recompute_ops = {"aten::linear", v == kCast ? "aten::to" : "aten::cat", "aten::matmul", "aten::softmax"};
    c.forward_dtypes = {"BFloat16", "Float", "BFloat16"};
    c.recompute_dtypes = {"BFloat16", "Float", "BFloat16", "Float"};
    c.forward_autocast = {"cpu:BFloat16", "cpu:BFloat16", "cpu:BFloat16"};
    c.recompute_autocast = std::vector<std::string>(4, "cpu:BFloat16");
    if (v == kAutocastLost) c.recompute_autocast[1] = "off";
    const auto r = h.run(*make_check("autocast"));
    EXPECT_EQ(r.status, v == kPath ? Status::kPass : Status::kFail) << r;
    if (v != kPath) {
      EXPECT_EQ(r.findings.at(0).details.at("op_index"), 1) << r;
    }
  }
}

TEST(ChecksOnRecords, AutocastSkipsWithoutAmp) {
  HandBuiltRecords h;
  EXPECT_EQ(h.run(*make_check("autocast")).status, Status::kSkip);
}

TEST(ChecksOnRecords, CheckpointedAmpFurtherFromFp32ThanPlainAmpWarns) {
  for (double ckpt_error : {0.5, 0.01}) {
    HandBuiltRecords h;
    h.config.amp = Amp::kBf16;
    const std::string w = "blocks.1.fc1.weight";
    h.differ(w, "param-grad", values(0.01), values(ckpt_error));
    h.records.fp32_reference = StepRecord();
    h.records.fp32_reference->tensors = {{w, "param-grad", 1, values()}};
    h.records.fp32_recompute = h.records.fp32_reference;
    const auto r = h.run(*make_check("autocast"));
    if (ckpt_error == 0.01) {
      EXPECT_EQ(r.status, Status::kPass) << r;  // as far from fp32 as plain AMP
    } else {
      EXPECT_EQ(r.status, Status::kWarn) << r;
      ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kAutocast}) << r;
      EXPECT_EQ(r.findings[0].site, "blocks.1");
    }
  }
}

TEST(ChecksOnRecords, TheAmpErrorFactorKnobMovesTheAutocastBound) {
  HandBuiltRecords h;
  h.config.amp = Amp::kBf16;
  const std::string w = "blocks.1.fc1.weight";
  h.differ(w, "param-grad", values(0.01), values(0.05));  // 5x plain AMP's error
  h.records.fp32_reference = StepRecord();
  h.records.fp32_reference->tensors = {{w, "param-grad", 1, values()}};
  h.records.fp32_recompute = h.records.fp32_reference;
  EXPECT_EQ(h.run(*make_check("autocast")).status, Status::kWarn);  // the default bound, 2x
  EXPECT_EQ(h.run(*make_check("autocast"), {{"amp-error-factor", 10.0}}).status, Status::kPass);
}

// --- nan -------------------------------------------------------------------------------------

TEST(ChecksOnRecords, NanOnlyWithCheckpointingFailsAsIntroduced) {
  HandBuiltRecords h;
  auto bad = values();
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  h.differ("blocks.1.fc1.weight", "param-grad", values(), bad);
  const auto r = h.run(*make_check("nan"));
  EXPECT_EQ(r.status, Status::kFail) << r;
  ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kNonFinite}) << r;
  EXPECT_EQ(r.findings[0].details.at("without_checkpointing"), false);
}

TEST(ChecksOnRecords, FiniteValuesPassNan) {
  HandBuiltRecords h;
  h.differ("blocks.1.fc1.weight", "param-grad", values(), values(0.5));  // different, but finite
  EXPECT_EQ(h.run(*make_check("nan")).status, Status::kPass);
}

// --- memory and overhead ---------------------------------------------------------------------

Measurement measured(int64_t peak, double seconds) {
  Measurement m;
  m.peak_bytes = peak;
  m.step_seconds = {seconds, seconds, seconds};
  m.forward_seconds = {seconds / 3};
  return m;
}

TEST(ChecksOnRecords, MemoryThatDoesNotGoDownFailsAsNotEffective) {
  for (int64_t checkpointed_peak : {1000, 400}) {
    HandBuiltRecords h;
    h.records.bench_plain = measured(1000, 1.0);
    h.records.bench_checkpointed = measured(checkpointed_peak, 1.2);
    const auto r = h.run(*make_check("memory"));
    if (checkpointed_peak < 1000) {
      EXPECT_EQ(r.status, Status::kPass) << r;
    } else {
      ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kNotEffective}) << r;
    }
  }
}

TEST(ChecksOnRecords, TimeOverTheBoundFailsAsTooFine) {
  for (double checkpointed_seconds : {2.0, 1.3}) {
    HandBuiltRecords h;
    h.records.bench_plain = measured(1000, 1.0);
    h.records.bench_checkpointed = measured(400, checkpointed_seconds);
    const auto r = h.run(*make_check("overhead"), {{"max-overhead", 0.5}});
    if (checkpointed_seconds < 1.5) {
      EXPECT_EQ(r.status, Status::kPass) << r;
    } else {
      ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kTooFine}) << r;
    }
  }
}

// The runner alternates plain and checkpointed steps: a slowdown that starts midway hits both
// steps of a pair, and the step-by-step ratio stays what checkpointing costs. The control: the
// same steps with the checkpointed ones slower in every pair fail.
TEST(ChecksOnRecords, OverheadComparesStepsPairByPair) {
  for (bool slower_in_every_pair : {false, true}) {
    HandBuiltRecords h;
    h.records.bench_plain = measured(1000, 1.0);
    h.records.bench_plain->step_seconds = {1.0, 1.0, 1.0, 8.0, 8.0};
    h.records.bench_checkpointed = measured(400, 1.0);
    const double f = slower_in_every_pair ? 9.6 : 1.2;
    h.records.bench_checkpointed->step_seconds = {f, 9.6, 9.6, 8 * f, 8 * f};
    const auto r = h.run(*make_check("overhead"), {{"max-overhead", 0.5}});
    EXPECT_EQ(r.status, slower_in_every_pair ? Status::kFail : Status::kPass) << r;
  }
}

TEST(ChecksOnRecords, MemoryAndOverheadSkipWhenNotMeasured) {
  HandBuiltRecords h;
  EXPECT_EQ(h.run(*make_check("memory")).status, Status::kSkip);
  EXPECT_EQ(h.run(*make_check("overhead")).status, Status::kSkip);
}

// --- collectives ----------------------------------------------------------------------------

// A recompute that drops its forward's all-reduce fails where it recomputed other values, warns
// where it reproduced them; the control: the same all-reduce in both passes.
TEST(ChecksOnRecords, ARecomputeThatDropsACollectiveIsNamed) {
  const std::string reduce = "c10d::allreduce_ 2x8 Float";
  for (int variant = 0; variant < 3; ++variant) {  // 0: the same ledger; 1: dropped, values equal; 2: dropped, differ
    HandBuiltRecords h;
    CallEvidence call;
    call.site = "blocks.0";
    call.recomputed = true;
    call.forward_collectives = {reduce};
    if (variant == 0) call.recompute_collectives = {reduce};
    TensorDiff out;
    out.equal = variant != 2;
    call.output_diffs = {out};
    h.records.checkpointed.calls = {call};
    const auto r = h.run(*make_check("collectives"));
    const Status expected[] = {Status::kPass, Status::kWarn, Status::kFail};
    EXPECT_EQ(r.status, expected[variant]) << r;
    if (variant == 0) continue;
    ASSERT_EQ(r.findings.size(), 1u) << r;
    EXPECT_EQ(std::string(r.findings[0].cause.name()), "recompute-collective");
    EXPECT_EQ(r.findings[0].site, "blocks.0");
    EXPECT_EQ(r.findings[0].tensor, reduce);
  }
}

TEST(ChecksOnRecords, NoCollectiveIssuedSkipsTheLedger) {
  HandBuiltRecords h;
  EXPECT_EQ(h.run(*make_check("collectives")).status, Status::kSkip);
}

// --- rank-rng and data-parallel --------------------------------------------------------------

TEST(ChecksOnRecords, RanksStartingFromOneRngStateFailAsRng) {
  for (bool same_state : {true, false}) {
    HandBuiltRecords h;
    h.records.ranks = {{0, 42, true, true, "", ""}, {1, same_state ? 42u : 43u, true, true, "", ""}};
    const auto r = h.run(*make_check("rank-rng"));
    if (!same_state) {
      EXPECT_EQ(r.status, Status::kPass) << r;
    } else {
      ASSERT_EQ(causes_of(r), std::vector<Cause>{Cause::kRng}) << r;
      EXPECT_EQ(r.findings[0].tensor, "rank 1");
    }
  }
}

TEST(ChecksOnRecords, ARankWhoseStepFailedIsNotJudgedForRng) {
  for (bool failed : {true, false}) {
    HandBuiltRecords h;
    h.records.ranks = {{0, 42, true, true, failed ? "Expected to mark a variable ready only once.\nParameter ..." : "", ""},
                       {1, 43, true, true, "", ""}};
    const auto r = h.run(*make_check("rank-rng"));
    EXPECT_EQ(r.status, failed ? Status::kError : Status::kPass) << r;
    EXPECT_TRUE(r.findings.empty()) << r;
    if (failed) {
      EXPECT_EQ(r.summary.find('\n'), std::string::npos) << r;
    }
  }
}

// Two ranks without a process group: the check reads only the world size.
class TwoRanks : public Collective {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string backend() const override { return "none"; }
  void allreduce_sum(std::vector<torch::Tensor>&) override {}
  void set(const std::string&, const std::string&) override {}
  std::string get(const std::string&) override { return ""; }
  void barrier() override {}
};

TEST(ChecksOnRecords, AveragedGradientsThatDifferFromTheWholeBatchFail) {
  for (bool differs : {true, false}) {
    TwoRanks collective;
    DataParallel dp(collective);
    HandBuiltRecords h;
    h.config.data_parallel = &dp;
    const std::string w = "blocks.0.fc1.weight";
    h.same(w, "param-grad", values());
    h.records.single_process = StepRecord();
    h.records.single_process->tensors = {{w, "param-grad", 1, values() * 2 + (differs ? 0.5 : 0.0)}};
    const auto r = h.run(*make_check("data-parallel"));
    if (!differs) {
      EXPECT_EQ(r.status, Status::kPass) << r;
    } else {
      EXPECT_EQ(r.status, Status::kFail) << r;
      ASSERT_EQ(r.findings.size(), 1u) << r;
      EXPECT_EQ(r.findings[0].site, "blocks.0");
      EXPECT_EQ(r.findings[0].tensor, w);
    }
  }
}

}  // namespace
}  // namespace ckcheck
