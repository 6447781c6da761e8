#include "harness/runner/plan.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "fixtures/registry.h"
#include "harness/support/errors.h"

namespace ckcheck {
namespace {

using Sites = std::vector<std::string>;

TEST(Glob, MatchesModulePaths) {
  EXPECT_TRUE(glob_match("blocks.*", "blocks.3.attn"));
  EXPECT_TRUE(glob_match("*.attn", "blocks.3.attn"));
  EXPECT_FALSE(glob_match("*.attn", "blocks.3.ffn"));
  EXPECT_TRUE(glob_match("layer?.*", "layer1.0"));
  EXPECT_FALSE(glob_match("layer?.*", "layer10"));
  EXPECT_TRUE(glob_match("blocks.[02]", "blocks.2"));
  EXPECT_FALSE(glob_match("blocks.[02]", "blocks.1"));
  EXPECT_TRUE(glob_match("blocks.[!0]", "blocks.1"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("", "x"));
}

RC_GTEST_PROP(Glob, LiteralPatternsMatchOnlyThemselves, (const std::string& a, const std::string& b)) {
  auto clean = [](std::string s) {
    for (auto& c : s) if (c == '*' || c == '?' || c == '[') c = '.';
    return s;
  };
  const auto pa = clean(a), pb = clean(b);
  RC_ASSERT(glob_match(pa, pa));
  RC_ASSERT(glob_match(pa, pb) == (pa == pb));
  RC_ASSERT(glob_match("*", pb));
}

TEST(Policy, ParsesAndPrints) {
  for (const std::string p : {"none", "every:1", "every:4", "segments:2", "segments:sqrt", "sites:*.attn,blocks.0",
                              "budget:0", "budget:0.25", "budget:1"}) {
    EXPECT_EQ(Policy::parse(p).text(), p);
  }
  EXPECT_EQ(Policy::parse("segments").text(), "segments:sqrt");
  for (const std::string bad : {"", "every", "every:0", "every:x", "segments:-1", "sites:", "sites:a,,b", "all", "none:1",
                                 "budget", "budget:", "budget:1.5", "budget:-0.1", "budget:nan", "budget:x"}) {
    EXPECT_THROW(Policy::parse(bad), UsageError) << bad;
  }
}

Plan plan_for(const std::string& model, Sites globs, const std::string& policy,
              std::map<std::string, std::string> opts = {{"layers", "4"}}) {
  auto m = make_model(model, opts, 0);
  return Plan::make(*m, globs, Policy::parse(policy));
}

TEST(Plan, EveryKTakesEveryKthCandidate) {
  EXPECT_EQ(plan_for("transformer", {}, "every:1").checkpointed(),
            (Sites{"blocks.0", "blocks.1", "blocks.2", "blocks.3"}));
  EXPECT_EQ(plan_for("transformer", {}, "every:2").checkpointed(), (Sites{"blocks.0", "blocks.2"}));
  EXPECT_TRUE(plan_for("transformer", {}, "none").units.empty());
}

TEST(Plan, OuterSiteWinsOverNestedOne) {
  auto p = plan_for("transformer", {"blocks.1*"}, "every:1");
  EXPECT_EQ(p.candidates, (Sites{"blocks.1"}));
  auto q = plan_for("transformer", {"*.attn", "blocks.2"}, "every:1");
  EXPECT_EQ(q.checkpointed(), (Sites{"blocks.0.attn", "blocks.1.attn", "blocks.2", "blocks.3.attn"}));
  auto r = plan_for("transformer", {}, "sites:blocks.1,blocks.1.ffn,*.attn");
  EXPECT_EQ(r.checkpointed(), (Sites{"blocks.0.attn", "blocks.1", "blocks.2.attn", "blocks.3.attn"}));
}

TEST(Plan, SegmentsGroupConsecutiveBlocksAndLeaveTheLastPlain) {
  auto p = plan_for("mlp", {}, "segments");  // 4 blocks: sqrt = 2 segments
  ASSERT_EQ(p.units.size(), 1u);
  EXPECT_EQ(p.units[0], (Sites{"blocks.0", "blocks.1"}));
  EXPECT_EQ(Plan::unit_label(p.units[0]), "blocks.0..blocks.1");
  EXPECT_EQ(plan_for("mlp", {}, "segments:4").units.size(), 3u);
  EXPECT_TRUE(plan_for("mlp", {}, "segments:1").units.empty());
  EXPECT_THROW(plan_for("mlp", {}, "segments:5"), UsageError);
  EXPECT_THROW(plan_for("transformer", {"*.attn"}, "segments:2"), UsageError);
}

TEST(Plan, TheCompilersBudgetIsAPolicyOfCompiledModelsOnly) {
  // A C++ model runs no compiler: budget:F is refused in one line that says where it applies.
  try {
    plan_for("mlp", {}, "budget:0.5");
    ADD_FAILURE() << "budget:0.5 accepted for a C++ model";
  } catch (const FieldError& e) {
    EXPECT_EQ(e.field(), "policy");
    const auto text = e.render([](const std::string& name) { return "--" + name; });
    EXPECT_NE(text.find("--compile"), std::string::npos) << text;
  }
}

TEST(Plan, UnmatchedGlobsAreUsageErrors) {
  EXPECT_THROW(plan_for("mlp", {"nothing.*"}, "every:1"), UsageError);
  EXPECT_THROW(plan_for("mlp", {}, "sites:*.attn"), UsageError);
  try {
    plan_for("mlp", {"x"}, "every:1");
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("its sites are: blocks.0, blocks.1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ckcheck
