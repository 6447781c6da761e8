#include "harness/runner/runner.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "fixtures/registry.h"
#include "tests/support/generators.h"
#include "tests/support/support.h"

namespace ckcheck {
namespace {

using testing::ModelCase;

struct Pair {
  StepRecord reference, checkpointed;
};

Pair run_pair(const ModelCase& c, RunConfig config = {}) {
  auto model = make_model(c.model, c.options, c.seed);
  config.seed = c.seed;
  config.checkpoint.restore_buffers = c.restore_buffers;
  if (c.amp) config.amp = Amp::kBf16;
  Runner runner(*model, config);
  auto plan = Plan::make(*model, {}, Policy::parse(c.policy));
  StepOptions plain;
  plain.evidence = false;
  Pair p{runner.run(nullptr, plain, "reference"), runner.run(&plan, StepOptions(), "checkpointed")};
  return p;
}

// Names of the tensors that differ between the two records (all kinds but buffers).
std::vector<std::string> differing(const Pair& p, bool buffers) {
  std::vector<std::string> out;
  for (const auto& t : p.reference.tensors) {
    if (is_state_kind(t.kind) != buffers) continue;
    const auto* other = p.checkpointed.find(t.name, t.kind, t.step);
    if (!other) {
      out.push_back(t.name + " (missing)");
      continue;
    }
    if (!compare_tensors(t.value, other->value, Tolerance()).equal) out.push_back(t.name);
  }
  return out;
}

RC_GTEST_PROP(Runner, CheckpointedStepIsBitwiseEqualToPlain, (const ModelCase& c)) {
  RC_TAG(c.model);
  auto p = run_pair(c);
  RC_ASSERT(p.reference.error.empty());
  RC_ASSERT(p.checkpointed.error.empty());
  const auto diff = differing(p, false);
  if (!diff.empty()) RC_FAIL("differs: " + diff.front() + "; reproduce: " + c.command());
  RC_ASSERT(!p.checkpointed.calls.empty() || c.policy == "segments:1" ||
            (c.policy == "segments" && c.options.at("layers") < "3"));
}

TEST(Runner, NegativeControlWithoutRngPreservationDiffers) {
  ModelCase c{"transformer", {{"dropout", "0.5"}}, "every:1", 3};
  RunConfig config;
  config.checkpoint.preserve_rng_state = false;
  auto p = run_pair(c, config);
  ASSERT_TRUE(p.checkpointed.error.empty()) << p.checkpointed.error;
  EXPECT_FALSE(differing(p, false).empty());
  // and with it, nothing differs
  EXPECT_TRUE(differing(run_pair(c), false).empty());
}

TEST(Runner, NegativeControlWithoutAutocastRestoreDiffers) {
  ModelCase c{"transformer", {{"dropout", "0"}}, "every:1", 5};
  c.amp = true;
  EXPECT_TRUE(differing(run_pair(c), false).empty());
  RunConfig config;
  config.checkpoint.restore_autocast = false;
  EXPECT_FALSE(differing(run_pair(c, config), false).empty());
}

TEST(Runner, ConvnetBuffersDifferUnlessRestored) {
  ModelCase c{"convnet", {}, "every:1", 1};
  auto twice = run_pair(c);
  EXPECT_TRUE(differing(twice, false).empty());
  EXPECT_FALSE(differing(twice, true).empty());
  c.restore_buffers = true;
  auto fixed = run_pair(c);
  EXPECT_TRUE(differing(fixed, true).empty());
}

TEST(Runner, SeveralStepsStayEqual) {
  ModelCase c{"mlp", {{"dropout", "0.2"}}, "every:1", 2};
  RunConfig config;
  config.steps = 3;
  auto p = run_pair(c, config);
  EXPECT_TRUE(differing(p, false).empty());
  EXPECT_NE(p.reference.find("loss", "loss", 3), nullptr);
}

TEST(Runner, EvidenceShowsRngUseAndZeroGradients) {
  ModelCase c{"mlp", {{"dropout", "0.3"}, {"zero-head", "true"}}, "every:1", 4};
  auto p = run_pair(c);
  ASSERT_EQ(p.checkpointed.calls.size(), 3u);
  for (const auto& call : p.checkpointed.calls) {
    EXPECT_TRUE(call.rng_consumed) << call.site;
    EXPECT_TRUE(call.grad_all_zero) << call.site;
    EXPECT_TRUE(call.recomputed) << call.site;
    for (const auto& d : call.output_diffs) EXPECT_TRUE(d.equal) << d;
  }
  ModelCase live{"mlp", {{"dropout", "0"}}, "every:1", 4};
  for (const auto& call : run_pair(live).checkpointed.calls) {
    EXPECT_FALSE(call.rng_consumed) << call.site;
    EXPECT_FALSE(call.grad_all_zero) << call.site;
  }
}

TEST(Runner, InPlaceInputIsRefusedAndRecorded) {
  ModelCase c{"faulty/inplace-input", {}, "every:1", 0};
  auto p = run_pair(c);
  EXPECT_TRUE(p.reference.error.empty()) << p.reference.error;
  EXPECT_NE(p.checkpointed.error.find("blocks.1"), std::string::npos) << p.checkpointed.error;
  bool seen = false;
  for (const auto& call : p.checkpointed.calls) {
    if (call.site == "blocks.1") seen = call.versions_exit != call.versions_entry;
  }
  EXPECT_TRUE(seen);
}

TEST(Runner, ProbeClassifiesRepeats) {
  auto probe = [](const std::string& model) {
    auto m = make_model(model, {}, 0);
    Runner r(*m, RunConfig());
    return r.probe(Plan::make(*m, {}, Policy::parse("every:1")));
  };
  auto find = [](const std::vector<UnitProbe>& ps, const std::string& site) {
    for (const auto& p : ps) if (p.site == site) return p;
    return UnitProbe{};
  };
  auto clean = probe("mlp");
  ASSERT_EQ(clean.size(), 3u);
  for (const auto& p : clean) EXPECT_TRUE(p.repeat_equal && p.restart_equal) << p.site;

  auto stateful = find(probe("faulty/stateful-counter"), "blocks.1");
  EXPECT_FALSE(stateful.repeat_equal);
  EXPECT_TRUE(stateful.restart_equal);
  EXPECT_EQ(stateful.changed_state, std::vector<std::string>{"blocks.1.counter"});

  auto nondet = find(probe("faulty/nondeterministic-op"), "blocks.1");
  EXPECT_FALSE(nondet.repeat_equal);
  EXPECT_FALSE(nondet.restart_equal);
  EXPECT_GT(nondet.max_abs_diff, 0.0);

  auto gen = find(probe("faulty/private-generator"), "blocks.1");
  EXPECT_TRUE(gen.private_generator);
  EXPECT_FALSE(gen.random_ops.empty());
}

// The probe runs where a recompute left something to explain, and only there: a unit whose
// recompute reproduced its forward bitwise is not run again (unless every unit is asked for).
TEST(Runner, ProbeRunsOnlyWhereTheRecomputeDiffered) {
  auto records = [](const std::string& model, bool every) {
    auto m = make_model(model, {{"dropout", "0.3"}}, 0);
    RunConfig config;
    config.probe_every_unit = every;
    Runner r(*m, config);
    Needs needs;
    needs.probe = true;
    return r.run_all(Plan::make(*m, {}, Policy::parse("every:1")), needs);
  };
  auto sites = [](const RunRecords& r) {
    std::vector<std::string> out;
    for (const auto& p : *r.probes) out.push_back(p.site);
    return out;
  };
  // Dropout with its RNG replayed: every recompute reproduces its forward, nothing is probed.
  const auto clean = records("mlp", false);
  ASSERT_TRUE(clean.probes);
  EXPECT_TRUE(clean.probes->empty());
  EXPECT_EQ(clean.reproduced_units, (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2"}));
  // Asked for, every unit is probed.
  EXPECT_EQ(sites(records("mlp", true)), (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2"}));
  EXPECT_TRUE(records("mlp", true).reproduced_units.empty());
  // The faulty unit's recompute differs: it alone is probed, and the probe still classifies it.
  for (const std::string model : {"faulty/stateful-counter", "faulty/nondeterministic-op"}) {
    const auto faulty = records(model, false);
    ASSERT_EQ(sites(faulty), std::vector<std::string>{"blocks.1"}) << model;
    EXPECT_FALSE(faulty.probes->front().repeat_equal) << model;
    EXPECT_EQ(faulty.reproduced_units, (std::vector<std::string>{"blocks.0", "blocks.2"})) << model;
  }
  // The records say what each part cost.
  std::vector<std::string> parts;
  for (const auto& [name, seconds] : clean.cpu_seconds) {
    parts.push_back(name);
    EXPECT_GE(seconds, 0.0) << name;
  }
  EXPECT_EQ(parts, (std::vector<std::string>{"reference", "checkpointed"}));
  EXPECT_GT(clean.reference.cpu_seconds, 0.0);
}

// The correct state/* models carry state that a step changes outside parameters and buffers:
// the plain step repeats only when that state is put back first, which the runner does.
TEST(StateModels, PlainStepRepeatsOnlyFromRestoredState) {
  for (const std::string name : {"state/counter-outside", "state/lazy-init"}) {
    auto m = make_model(name, {}, 0);
    const auto x0 = m->make_inputs(0), x1 = m->make_inputs(1);
    PlainSiteRunner plain;
    const auto start = m->snapshot();
    m->forward(x0, plain);
    // The negative control: after a step, without the state put back, the same input gives another result.
    const auto after_a_step = m->forward(x1, plain).at(0).detach().clone();
    m->restore(start);
    const auto first = m->forward(x1, plain).at(0).detach().clone();
    EXPECT_FALSE(torch::equal(first, after_a_step)) << name << ": the state makes no difference, so the fixture proves nothing";
    m->restore(start);
    const auto restored = m->forward(x1, plain).at(0).detach().clone();
    EXPECT_TRUE(torch::equal(first, restored)) << name;
  }
}

}  // namespace
}  // namespace ckcheck
