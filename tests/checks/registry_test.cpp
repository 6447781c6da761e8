// Loops over the registries, so a new check or fixture is covered the day it is added.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "checks/check.h"
#include "cli/app.h"
#include "fixtures/registry.h"
#include "harness/runner/runner.h"
#include "harness/support/checkpoint_kind.h"
#include "harness/support/errors.h"
#include "tests/support/run_case.h"

namespace ckcheck {
namespace {

TEST(CheckRegistry, IdsAreUniqueAndDescribed) {
  std::set<std::string> ids;
  for (const auto& c : builtin_checks()) {
    EXPECT_TRUE(ids.insert(c->id()).second) << c->id();
    EXPECT_FALSE(c->info().description.empty()) << c->id();
  }
  for (const auto& h : hazard_check_ids()) EXPECT_TRUE(ids.count(h)) << h;
  for (const std::string contract : {"gradients", "buffers", "input-mutation", "rng", "autocast", "determinism", "nan"}) {
    EXPECT_TRUE(ids.count(contract)) << contract;
  }
}

TEST(CheckRegistry, EachCheckDeclaresItsPlaceKindAndKnobs) {
  std::set<int> orders;
  std::set<std::string> knobs;
  for (const auto& c : builtin_checks()) {
    const auto& info = c->info();
    EXPECT_TRUE(orders.insert(info.order).second) << c->id() << " shares its report place";
    for (const auto& k : info.knobs) {
      EXPECT_TRUE(knobs.insert(k.name).second) << k.name << " is declared twice";
      EXPECT_GE(k.default_value, k.min) << k.name;
      EXPECT_LE(k.default_value, k.max) << k.name;
      EXPECT_EQ(&find_knob(k.name), &find_knob(k.name));
      EXPECT_EQ(find_knob(k.name).default_value, k.default_value);
    }
  }
  // The hazards diagnose explains a divergence with: the checks of that kind, nothing else.
  EXPECT_EQ(hazard_check_ids(), (std::vector<std::string>{"input-mutation", "rng", "autocast", "determinism"}));
  EXPECT_THROW(find_knob("no-such-knob"), UsageError);
  EXPECT_EQ(make_check("hooks")->id(), "hooks");
  EXPECT_THROW(make_check("hook"), UsageError);
}

TEST(CheckRegistry, SelectFailsLoudlyOnUnknownIds) {
  EXPECT_EQ(select_checks({"rng", "gradients"}).size(), 2u);
  EXPECT_EQ(select_checks({"rng", "gradients"})[0]->id(), "gradients");  // report order
  try {
    select_checks({"rnd"});
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown check 'rnd'; checks: gradients, buffers"), std::string::npos) << e.what();
  }
}

std::vector<std::string> ids_of(const std::vector<std::unique_ptr<Check>>& checks) {
  std::vector<std::string> out;
  for (const auto& c : checks) out.push_back(c->id());
  return out;
}

// Each check declares when it applies; the front end states the situation and names none.
TEST(CheckRegistry, TheSituationChoosesTheChecksEachOnce) {
  const auto plain = ids_of(select_checks({}));
  for (const char* situational : {"memory", "overhead", "gradient-accumulation", "compile", "offload"}) {
    EXPECT_EQ(std::count(plain.begin(), plain.end(), situational), 0) << situational;
  }
  Situation all;
  all.bench = all.accumulation = all.compile = all.offload = true;
  const auto every = ids_of(select_checks({}, all));
  EXPECT_EQ(every.size(), builtin_checks().size());  // each once: --bench with --accumulate listed it twice
  // The general checks (those of --bench among them) in report order, then the situation's own.
  const std::vector<std::string> tail(every.end() - 3, every.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"gradient-accumulation", "compile", "offload"}));
  EXPECT_LT(std::find(every.begin(), every.end(), "memory") - every.begin(),
            std::find(every.begin(), every.end(), "hooks") - every.begin());
  Situation compiled;
  compiled.compile = true;
  EXPECT_EQ(ids_of(select_checks({}, compiled)).back(), "compile");
  EXPECT_EQ(ids_of(select_checks({"rng"}, all)), std::vector<std::string>{"rng"});  // named: only those
}

TEST(CheckpointKinds, NamesRoundTripAndAnUnknownOneIsRefused) {
  const auto names = checkpoint_option_names();
  for (const auto& name : names) EXPECT_EQ(checkpoint_kind_name(parse_checkpoint_kind(name)), name);
  EXPECT_EQ(parse_checkpoint_kind("compiler"), CheckpointKind::kCompiler);  // resolved to, never asked for
  EXPECT_EQ(std::count(names.begin(), names.end(), "compiler"), 0);
  EXPECT_THROW(parse_checkpoint_kind("torch_reentrant"), UsageError);
}

TEST(Causes, VocabularyRoundTripsAndHasHints) {
  for (auto c : all_causes()) {
    EXPECT_EQ(parse_cause(cause_name(c)), c);
    EXPECT_FALSE(fix_hint(c).empty());
  }
  EXPECT_FALSE(parse_cause("unknown").has_value());
}

// The vocabulary is the shared words and those the checks declare; a name is one word only.
TEST(Causes, ChecksAddTheirOwnWordsAndNoNameIsTakenTwice) {
  std::set<std::string> names;
  size_t declared = 0;
  for (auto c : all_causes()) EXPECT_TRUE(names.insert(cause_name(c)).second) << "twice: " << c;
  for (const auto& check : builtin_checks()) {
    for (auto c : check->info().causes) {
      ++declared;
      EXPECT_EQ(parse_cause(c.name()), c) << check->id() << " declares " << c << " outside the vocabulary";
    }
  }
  EXPECT_GT(declared, 0u) << "no check declares a word of its own";
  EXPECT_TRUE(parse_cause("accumulated-grad").has_value());
}

class EveryModel : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryModel, BuildsWithDefaultsAndIsReproducible) {
  auto a = make_model(GetParam(), {}, 11);
  auto b = make_model(GetParam(), {}, 11);
  auto other = make_model(GetParam(), {}, 12);
  EXPECT_FALSE(a->sites().empty());
  EXPECT_FALSE(a->default_sites().empty());
  for (const auto& s : a->default_sites()) {
    EXPECT_NE(std::find(a->sites().begin(), a->sites().end(), s), a->sites().end()) << s;
  }
  auto pa = a->named_parameters(), pb = b->named_parameters(), po = other->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  bool seed_matters = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
    seed_matters = seed_matters || !torch::equal(pa[i].second, po[i].second);
  }
  EXPECT_TRUE(seed_matters);
  auto xa = a->make_inputs(3), xb = b->make_inputs(3);
  ASSERT_EQ(xa.size(), xb.size());
  for (size_t i = 0; i < xa.size(); ++i) EXPECT_TRUE(torch::equal(xa[i], xb[i]));
}

TEST_P(EveryModel, SnapshotRestoresEveryTensor) {
  auto m = make_model(GetParam(), {}, 0);
  const auto before = m->snapshot();
  {
    torch::NoGradGuard g;
    for (auto& [n, p] : m->named_parameters()) p.add_(1);
    for (auto& [n, b] : m->named_buffers()) b.add_(1);
  }
  m->restore(before);
  const auto after = m->snapshot();
  ASSERT_EQ(before.tensors.size(), after.tensors.size());
  for (size_t i = 0; i < after.tensors.size(); ++i) {
    EXPECT_TRUE(torch::equal(before.tensors[i].second, after.tensors[i].second)) << after.tensors[i].first;
  }
}

TEST_P(EveryModel, UnknownOptionsAreRefusedWithTheKnownOnes) {
  try {
    make_model(GetParam(), {{"no-such-option", "1"}}, 0);
    FAIL();
  } catch (const FieldError& e) {
    // The library names the fields; the command line gives them as its flags.
    EXPECT_EQ(e.field(), "no_such_option");
    EXPECT_NE(std::string(e.what()).find("has no option no_such_option; its options are: "), std::string::npos) << e.what();
    EXPECT_NE(e.render(cli::flag_for_field).find("has no option --no-such-option; its options are: --"), std::string::npos)
        << e.what();
  }
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& s : builtin_models()) names.push_back(s.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EveryModel, ::testing::ValuesIn(model_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n) if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(ModelRegistry, UnknownNameListsTheKnownOnes) {
  try {
    make_model("resnet", {}, 0);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("built-in models: mlp, transformer, convnet, faulty/"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_model("transformer", {{"hidden", "30"}, {"heads", "4"}}, 0), UsageError);
  EXPECT_THROW(make_model("mlp", {{"layers", "0"}}, 0), UsageError);
  EXPECT_THROW(make_model("mlp", {{"dropout", "x"}}, 0), UsageError);
  EXPECT_THROW(make_model("faulty/stateful-counter", {{"fault-site", "3"}}, 0), UsageError);
}

}  // namespace
}  // namespace ckcheck

namespace ckcheck {
namespace {

// No finding's cause may contradict another check of the same report: non-deterministic only
// where the determinism probe itself fails or warns, stateful only where it names a changed state.
TEST_P(EveryModel, NoFindingContradictsAnotherCheck) {
  if (GetParam() == "faulty/rank-fault") GTEST_SKIP() << "needs ranks";
  const auto r = testing::run_case({GetParam(), {}, "every:1", 0});
  const auto& determinism = r.check("determinism");
  for (const auto& c : r.results) {
    for (const auto& f : c.findings) {
      if (f.cause == Cause::kNonDeterministic || f.cause == Cause::kStateful) {
        EXPECT_TRUE(determinism.status == Status::kFail || determinism.status == Status::kWarn)
            << c.id << " blames " << cause_name(f.cause) << " at " << f.site << " while determinism is "
            << status_name(determinism.status) << ": " << r.summary();
      }
    }
  }
}

}  // namespace
}  // namespace ckcheck
