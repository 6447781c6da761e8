// ckcheck diagnose on every planted fault: the right site, the first divergent op, the right cause;
// the NaN origin; and nothing on a clean model.
#include "analyses/diagnose.h"

#include <gtest/gtest.h>

#include "fixtures/registry.h"
#include "reports/report.h"
#include "tests/support/generators.h"

namespace ckcheck {
namespace {

using testing::ModelCase;

Diagnosis diagnose_case(const ModelCase& c, bool preserve_rng = true) {
  auto model = make_model(c.model, c.options, c.seed);
  RunConfig config;
  config.seed = c.seed;
  config.checkpoint.preserve_rng_state = preserve_rng;
  if (c.amp) config.amp = Amp::kBf16;
  const auto plan = Plan::make(*model, {}, Policy::parse(c.policy));
  Runner runner(*model, config);
  const auto outcome = run_checks(runner, plan, Tolerance(), select_checks({}));
  return diagnose(runner, plan, Tolerance(), outcome);
}

struct Expected {
  std::string name;
  ModelCase model;
  bool preserve_rng;
  std::string site;
  Cause cause = Cause::kUnexplained;
  std::string op;         // the first divergent op
  std::string innermost;  // "" when not checked
};

std::ostream& operator<<(std::ostream& os, const Expected& e) { return os << e.name; }

class DiagnoseFault : public ::testing::TestWithParam<Expected> {};

TEST_P(DiagnoseFault, NamesSiteOpAndCause) {
  const auto& e = GetParam();
  const auto d = diagnose_case(e.model, e.preserve_rng);
  EXPECT_TRUE(d.diverges);
  ASSERT_FALSE(d.sites.empty()) << d.summary;
  EXPECT_EQ(d.sites.front().site, e.site) << d.summary;
  EXPECT_EQ(d.sites.front().cause, e.cause) << d.summary;
  EXPECT_FALSE(d.sites.front().hint.empty());
  ASSERT_TRUE(d.op_diff.has_value()) << d.summary;
  EXPECT_EQ(d.op_diff->site, e.site);
  ASSERT_GE(d.op_diff->index, 0) << d.op_diff->note;
  EXPECT_EQ(d.op_diff->forward.name, e.op) << d.summary;
  if (!e.innermost.empty()) {
    EXPECT_EQ(d.op_diff->innermost, e.innermost) << d.summary;
  }
  EXPECT_FALSE(d.op_diff->context.empty());
}

ModelCase amp(ModelCase c) {
  c.amp = true;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, DiagnoseFault,
    ::testing::Values(
        Expected{"dropout_without_rng", {"transformer", {}, "every:1", 0}, false, "blocks.0", Cause::kRng, "aten::dropout", "aten::bernoulli_"},
        Expected{"inplace_input", {"faulty/inplace-input", {}, "every:1", 0}, true, "blocks.1", Cause::kInPlace, "aten::mul_", ""},
        Expected{"private_generator", {"faulty/private-generator", {{"fault-site", "2"}}, "every:1", 0}, true, "blocks.2", Cause::kRng, "aten::bernoulli_", ""},
        Expected{"stateful_counter", {"faulty/stateful-counter", {{"fault-site", "0"}}, "every:1", 0}, true, "blocks.0", Cause::kStateful, "aten::mul", ""},
        Expected{"nondeterministic_op", {"faulty/nondeterministic-op", {}, "every:1", 0}, true, "blocks.1", Cause::kNonDeterministic, "aten::add", ""},
        Expected{"autocast_sensitive", amp({"faulty/autocast-sensitive", {}, "every:1", 0}), true, "blocks.1", Cause::kAutocast, "aten::to", ""},
        Expected{"batchnorm", {"convnet", {}, "every:1", 0}, true, "blocks.0", Cause::kBufferUpdate, "aten::add_", ""}),
    [](const auto& info) { return info.param.name; });

TEST(Diagnose, OnlyTheFaultySiteIsBlamedAmongCleanOnes) {
  const auto d = diagnose_case({"faulty/stateful-counter", {{"layers", "4"}, {"fault-site", "2"}}, "every:1", 0});
  ASSERT_EQ(d.sites.size(), 1u) << d.summary;
  EXPECT_EQ(d.sites[0].site, "blocks.2");
  EXPECT_FALSE(d.interaction);
  EXPECT_GT(d.bisection_runs, 0);
}

class DiagnoseNan : public ::testing::TestWithParam<int> {};

TEST_P(DiagnoseNan, LogOfANegativeValueInBlockK) {
  const int k = GetParam();
  const auto d = diagnose_case({"faulty/nan-log", {{"fault-site", std::to_string(k)}}, "every:1", 0});
  EXPECT_TRUE(d.non_finite);
  EXPECT_FALSE(d.diverges) << "NaN in the same places is not a divergence";
  ASSERT_TRUE(d.nan_reference.found);
  EXPECT_EQ(d.nan_reference.op, "aten::log");
  EXPECT_EQ(d.nan_reference.site, "blocks." + std::to_string(k));
  EXPECT_EQ(d.nan_reference.phase, Phase::kForward);
  ASSERT_TRUE(d.nan_checkpointed.found);
  EXPECT_EQ(d.nan_checkpointed.op, "aten::log");
  EXPECT_EQ(d.nan_checkpointed.site, "blocks." + std::to_string(k));
  const auto j = diagnosis_json(d);
  EXPECT_TRUE(j.at("nan_origin").at("without_checkpointing").get<bool>());
  EXPECT_FALSE(j.at("nan_origin").at("introduced_by_checkpointing").get<bool>());
}

INSTANTIATE_TEST_SUITE_P(Blocks, DiagnoseNan, ::testing::Values(0, 1, 2));

TEST(Diagnose, CleanModelDivergesNowhere) {
  for (const char* m : {"mlp", "transformer"}) {
    const auto d = diagnose_case({m, {}, "every:1", 0});
    EXPECT_FALSE(d.diverges) << m;
    EXPECT_FALSE(d.non_finite) << m;
    EXPECT_TRUE(d.sites.empty());
    EXPECT_FALSE(d.op_diff.has_value());
    EXPECT_NE(d.summary.find("nothing diverges"), std::string::npos) << d.summary;
  }
}

}  // namespace
}  // namespace ckcheck
