// The bench and plan reports' memory-time chart, byte for byte, from fixed figures: a ratio chart
// with the budget drawn as a line, a recommended, a failing, an over-budget and an unranked policy;
// and a millisecond chart in GiB whose budget lies beyond it. (tests/eager/test_chart.py lays the
// chart out in a browser; this pins what the SVG says.) A changed chart is written beside the
// build's tests as chart_<name>.svg: look at it, then copy it over the golden file.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "reports/sections.h"
#include "tests/support/support.h"

namespace ckcheck {
namespace {

PolicyBench policy(const std::string& name, double ratio, double low, double high, int64_t peak) {
  PolicyBench p;
  p.policy = name;
  p.measurement.step_seconds = {0.01};
  p.measurement.peak_bytes = peak;
  p.time_ratio = ratio, p.time_ratio_low = low, p.time_ratio_high = high;
  p.time_median_s = 0.01 * ratio, p.time_min_s = 0.01 * low, p.time_max_s = 0.01 * high;
  p.ranked = true;
  return p;
}

BenchResult ratio_chart() {
  BenchResult r;
  r.baseline_bytes = 4 << 20;
  r.memory_budget_bytes = (4 << 20) + (30 << 20);
  r.policies = {policy("none", 1.0, 1.0, 1.0, 48 << 20), policy("every:1", 1.38, 1.33, 1.42, 14 << 20),
                policy("every:2", 1.2, 1.17, 1.24, 22 << 20), policy("every:4", 1.1, 1.08, 1.13, 33 << 20),
                policy("segments:3", 1.19, 1.16, 1.22, 21 << 20)};
  r.policies[0].fits = false;
  r.policies[2].checks = Verdict::kFail;
  r.policies[2].ranked = false;
  r.policies[3].fits = false;
  r.policies[4].ranked = false;
  r.recommendation = "every:2";
  r.policies[2].checks = Verdict::kPass;
  r.policies[2].ranked = true;
  r.policies[1].checks = Verdict::kFail;
  r.policies[1].ranked = false;
  return r;
}

BenchResult millisecond_chart() {
  BenchResult r;  // no none measured: times in milliseconds
  r.baseline_bytes = int64_t{1} << 30;
  r.memory_budget_bytes = int64_t{64} << 30;
  r.policies = {policy("every:1", 1.4, 1.3, 1.5, int64_t{3} << 30), policy("every:3", 1.1, 1.0, 1.2, int64_t{5} << 30)};
  r.recommendation = "every:1";
  return r;
}

void expect_golden(const std::string& name, const std::string& svg) {
  const std::string path = testing::test_source_dir() + "/reports/golden/chart_" + name + ".svg";
  std::ifstream in(path);
  std::stringstream golden;
  golden << in.rdbuf();
  if (svg != golden.str()) {
    const std::string out = "chart_" + name + ".svg";
    std::ofstream(out) << svg;
    FAIL() << "the " << name << " chart differs from " << path << "; the new one is in " << out;
  }
}

TEST(Chart, RatioChartWithTheBudgetDrawn) { expect_golden("ratio", bench_svg(ratio_chart())); }

TEST(Chart, MillisecondChartInGibWithTheBudgetBeyondIt) { expect_golden("ms", bench_svg(millisecond_chart())); }

TEST(Chart, NothingMeasuredIsNoChart) {
  auto r = ratio_chart();
  for (auto& p : r.policies) p.measurement.step_seconds.clear();
  EXPECT_EQ(bench_svg(r), "");
}

}  // namespace
}  // namespace ckcheck
