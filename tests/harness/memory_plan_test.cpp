// ckcheck plan: the solver against every subset of the sites, the prediction against the peak a
// step measures under each plan, and the verification loop on a planted fault.
#include "analyses/plan.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <limits>

#include "fixtures/registry.h"
#include "harness/runner/plan.h"
#include "harness/runner/profile.h"
#include "harness/support/errors.h"

namespace ckcheck {
namespace {

// A profile laid out as a step runs: before the sites, each site's forward and what follows it,
// then each site's backward, last site first.
StepProfile layout(const std::vector<SiteCost>& sites, const std::vector<int64_t>& peaks) {
  StepProfile p;
  p.sites = sites;
  p.step_seconds = 1.0;
  size_t k = 0;
  auto next = [&] { return peaks[k++ % peaks.size()]; };
  p.regions.push_back({"before the sites", next(), 0.0, 0, std::nullopt});
  for (size_t i = 0; i < sites.size(); ++i) {
    p.regions.push_back({"forward of " + sites[i].site, next(), 0.0, i, std::nullopt});
    p.regions.push_back({"after " + sites[i].site, next(), 0.0, i + 1, std::nullopt});
  }
  for (size_t i = sites.size(); i-- > 0;) p.regions.push_back({"backward of " + sites[i].site, next(), 0.0, i, i});
  for (const auto& r : p.regions) p.peak_bytes = std::max(p.peak_bytes, r.peak_bytes);
  return p;
}

double cost_of(const StepProfile& p, const std::vector<bool>& s) { return predict_seconds(p, s) - p.step_seconds; }

RC_GTEST_PROP(PlanSolver, FindsTheCheapestPlanThatFitsAmongAllSubsets, ()) {
  {
    const auto n = *rc::gen::inRange<size_t>(1, 9);
    std::vector<SiteCost> sites;
    for (size_t i = 0; i < n; ++i) {
      SiteCost c;
      c.site = "s";
      c.site += std::to_string(i);  // not "s" + ...: GCC 12 warns of a false overflow there (-Wstringop-overflow)
      c.kept_bytes = *rc::gen::inRange<int64_t>(0, 60);
      c.output_bytes = *rc::gen::inRange<int64_t>(0, 8);
      c.recompute_extra_bytes = *rc::gen::inRange<int64_t>(0, 30);
      // Sites alike in memory cost alike (the solver counts their median time).
      c.recompute_seconds = 0.001 * static_cast<double>(1 + (c.kept_bytes * 7 + c.output_bytes) % 5);
      sites.push_back(c);
    }
    const auto peaks = *rc::gen::container<std::vector<int64_t>>(3 * n + 1, rc::gen::inRange<int64_t>(0, 400));
    const auto p = layout(sites, peaks);
    const auto budget = *rc::gen::inRange<int64_t>(0, 420);
    std::set<size_t> excluded;
    for (size_t i = 0; i < n; ++i) {
      if (*rc::gen::inRange(0, 5) == 0) excluded.insert(i);
    }
    // Every subset that leaves the excluded sites alone.
    double best = std::numeric_limits<double>::infinity();
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      std::vector<bool> s(n);
      bool allowed = true;
      for (size_t i = 0; i < n; ++i) {
        s[i] = (mask >> i) & 1u;
        allowed = allowed && !(s[i] && excluded.count(i));
      }
      if (allowed && predict_peak(p, s) <= budget) best = std::min(best, cost_of(p, s));
    }
    const auto got = solve_plan(p, budget, excluded);
    RC_ASSERT(got.has_value() == (best < std::numeric_limits<double>::infinity()));
    if (!got) return;
    RC_ASSERT(predict_peak(p, *got) <= budget);
    for (size_t i : excluded) RC_ASSERT(!(*got)[i]);
    RC_ASSERT(std::abs(cost_of(p, *got) - best) <= 1e-12);
  }
}

RC_GTEST_PROP(PlanSolver, FindsTheCheapestSelectivePlanAmongAllSitesAndOpSubsets, ()) {
  const auto n = *rc::gen::inRange<size_t>(1, 6);
  const auto k = *rc::gen::inRange<size_t>(1, 5);
  std::vector<SiteCost> sites;
  for (size_t i = 0; i < n; ++i) {
    SiteCost c;
    c.site = "s";
    c.site += std::to_string(i);  // not "s" + ...: GCC 12 warns of a false overflow there (-Wstringop-overflow)
    c.kept_bytes = *rc::gen::inRange<int64_t>(0, 60);
    c.recompute_extra_bytes = *rc::gen::inRange<int64_t>(0, 30);
    c.recompute_seconds = 0.001 * static_cast<double>(10 + i);  // distinct: no grouping
    c.output_bytes = static_cast<int64_t>(i) + 1000;            // no two sites alike
    sites.push_back(c);
  }
  auto p = layout(sites, *rc::gen::container<std::vector<int64_t>>(3 * n + 1, rc::gen::inRange<int64_t>(0, 400)));
  for (size_t c = 0; c < k; ++c) {
    OpClassCost oc;
    oc.op = "aten.op" + std::to_string(c);
    for (size_t i = 0; i < n; ++i) {
      oc.site_bytes.push_back(*rc::gen::inRange<int64_t>(0, 20));
      oc.site_seconds.push_back(0.001 * static_cast<double>(*rc::gen::inRange(0, 4)));
    }
    p.op_classes.push_back(oc);
  }
  const auto budget = *rc::gen::inRange<int64_t>(0, 420);
  // Every non-empty op subset with every non-empty set of sites.
  double best = std::numeric_limits<double>::infinity();
  for (uint32_t ops = 1; ops < (1u << k); ++ops) {
    for (uint32_t mask = 1; mask < (1u << n); ++mask) {
      SacPlan plan;
      for (size_t c = 0; c < k; ++c) {
        if ((ops >> c) & 1u) plan.saved.push_back(c);
      }
      for (size_t i = 0; i < n; ++i) plan.sites.push_back((mask >> i) & 1u);
      // A site whose checkpoint frees nothing under the subset is never taken.
      bool frees = true;
      for (size_t i = 0; i < n; ++i) {
        int64_t kept = 0;
        for (size_t c : plan.saved) kept += p.op_classes[c].site_bytes[i];
        frees = frees && (!plan.sites[i] || p.sites[i].kept_bytes - kept > 0);
      }
      if (frees && predict_sac_peak(p, plan) <= budget) best = std::min(best, predict_sac_seconds(p, plan));
    }
  }
  int64_t weighed = 0;
  const auto got = solve_sac_plan(p, budget, {}, {}, &weighed);
  RC_ASSERT(weighed == static_cast<int64_t>((1u << k) - 1));
  // Where checkpointing nothing fits, no selective plan beats it.
  if (predict_peak(p, std::vector<bool>(n, false)) <= budget) {
    RC_ASSERT(!got.has_value());
    return;
  }
  RC_ASSERT(got.has_value() == (best < std::numeric_limits<double>::infinity()));
  if (!got) return;
  RC_ASSERT(predict_sac_peak(p, *got) <= budget);
  RC_ASSERT(std::abs(predict_sac_seconds(p, *got) - best) <= 1e-12);
}

TEST(PlanSolver, WritesASelectivePlanAsAPolicyRunAccepts) {
  std::vector<SiteCost> sites = {{"blocks.0", 4, 4, 50, 60, 0.3, 4, 0.1}, {"blocks.1", 4, 4, 30, 40, 0.3, 4, 0.2}};
  auto p = layout(sites, {0});
  p.op_classes = {{"aten.mm", 2, {10, 10}, {0.01, 0.01}}, {"aten.gelu", 2, {5, 5}, {0.02, 0.02}}};
  EXPECT_EQ(sac_policy(p, {{true, true}, {0, 1}}), "sac:aten.gelu+aten.mm");
  EXPECT_EQ(sac_policy(p, {{false, true}, {0}}), "sac:aten.mm@blocks.1");
  const auto policy = Policy::parse("sac:aten.mm@blocks.1");
  EXPECT_EQ(policy.ops, std::vector<std::string>{"aten.mm"});
  EXPECT_EQ(policy.globs, std::vector<std::string>{"blocks.1"});
  EXPECT_EQ(policy.text(), "sac:aten.mm@blocks.1");
  EXPECT_THROW(Policy::parse("sac:aten.mm@"), UsageError);
}

TEST(PlanSolver, OfIdenticalBlocksTakesThoseThatFreeMemoryEarliest) {
  std::vector<SiteCost> sites;
  for (int i = 0; i < 4; ++i) sites.push_back({"b" + std::to_string(i), 10, 10, 100, 120, 0.02, 10, 0.01 + 0.001 * i});
  // The plain step's memory grows by 100 per block and peaks in the last block's backward.
  auto p = layout(sites, {0});
  for (auto& r : p.regions) r.peak_bytes = 100 * static_cast<int64_t>(r.holding) + (r.recomputes ? 110 : 20);
  const auto s = solve_plan(p, 250);
  ASSERT_TRUE(s.has_value());
  // Two blocks must go; the first two free memory for every stretch after them.
  EXPECT_EQ(*s, (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(plan_policy(p, *s), "sites:b0,b1");
  EXPECT_EQ(plan_policy(p, {false, false, false, false}), "none");
  EXPECT_EQ(plan_policy(p, {true, true, true, true}), "every:1");
  // Nothing fits below what every block checkpointed still needs.
  EXPECT_FALSE(solve_plan(p, predict_peak(p, {true, true, true, true}) - 1).has_value());
  // A site set aside is never taken.
  const auto without = solve_plan(p, 250, {0});
  ASSERT_TRUE(without.has_value());
  EXPECT_FALSE((*without)[0]);
}

TEST(PlanPrediction, ReadsTheStretchesOfTheProfile) {
  std::vector<SiteCost> sites = {{"a", 4, 4, 50, 60, 0.3, 4, 0.1}, {"b", 4, 4, 30, 40, 0.3, 4, 0.2}};
  auto p = layout(sites, {0});
  // before, fwd a, after a, fwd b, after b, bwd b, bwd a
  const std::vector<int64_t> peaks = {5, 60, 54, 94, 88, 100, 70};
  for (size_t i = 0; i < p.regions.size(); ++i) p.regions[i].peak_bytes = peaks[i];
  std::string where;
  EXPECT_EQ(predict_peak(p, {false, false}, &where), 100);
  EXPECT_EQ(where, "backward of b");
  // a checkpointed: every stretch after a's forward holds 50 less (b's backward peaks at 50), and
  // a's backward runs its forward again: 70 + the 4 its checkpoint adds there.
  EXPECT_EQ(predict_peak(p, {true, false}, &where), 74);
  EXPECT_EQ(where, "backward of a");
  // b checkpointed: after b 58, its backward 100 + 4.
  EXPECT_EQ(predict_peak(p, {false, true}), 104);
  EXPECT_DOUBLE_EQ(predict_seconds(p, {true, true}), 1.3);
}

// The prediction from one profile against the peak each plan's step measures (the tracking
// allocator in front of LibTorch's): within 10% for every plan of these models.
struct Sized {
  std::string model;
  std::map<std::string, std::string> options;
};

class PredictionAgainstMeasurement : public ::testing::TestWithParam<Sized> {};

TEST_P(PredictionAgainstMeasurement, WithinTenPercentForEveryPlan) {
  const auto& c = GetParam();
  auto model = make_model(c.model, c.options, 0);
  Runner runner(*model, RunConfig{});
  const auto candidates = Plan::make(*model, {}, Policy::parse("every:1")).candidates;
  const auto profile = profile_sites(runner, candidates, 1, 2);
  ASSERT_TRUE(profile.error.empty()) << profile.error;
  const size_t n = candidates.size();
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    std::vector<bool> s(n);
    for (size_t i = 0; i < n; ++i) s[i] = (mask >> i) & 1u;
    const auto policy = plan_policy(profile, s);
    const auto plan = Plan::make(*model, {}, Policy::parse(policy));
    const auto m = runner.measure(&plan, 1, 1);
    ASSERT_TRUE(m.error.empty()) << m.error;
    const double predicted = static_cast<double>(predict_peak(profile, s));
    const double measured = static_cast<double>(m.peak_bytes);
    EXPECT_NEAR(predicted / measured, 1.0, 0.10) << c.model << " " << policy << ": predicted " << predicted << ", measured " << measured;
    // Checkpointing frees what the profile says a site keeps.
    if (mask == 0) {
      EXPECT_EQ(m.peak_bytes, profile.peak_bytes);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PredictionAgainstMeasurement,
                         ::testing::Values(Sized{"transformer", {{"layers", "4"}, {"hidden", "64"}, {"heads", "4"}, {"seq", "64"}, {"batch", "4"}}},
                                           Sized{"mlp", {{"layers", "4"}, {"hidden", "256"}, {"batch", "64"}}},
                                           Sized{"convnet", {}}),
                         [](const auto& info) { return info.param.model; });

}  // namespace
}  // namespace ckcheck
