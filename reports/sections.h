// The command-specific results of a report (diagnosis, bench, op validation) as text, from their
// typed form: the lines each text format lays out in its own way (console as is, Markdown fenced
// or listed, HTML escaped).
#pragma once

#include <string>
#include <vector>

#include "reports/report.h"

namespace ckcheck {

/// A duration for people: 1.23 s, 4.5 ms, 67 us.
std::string seconds_text(double s);
std::vector<std::string> diagnosis_lines(const Diagnosis& d);
std::vector<std::string> validation_lines(const OpValidation& v);

/// One row of the bench table, every cell as text ("-" where not measured).
struct BenchRow {
  std::string policy, units, peak, peak_ratio, analytic, time, time_ratio, checks, note;
};
std::vector<BenchRow> bench_rows(const BenchResult& r);
/// Device, baseline, rounds and clock, in one sentence.
std::string bench_header(const BenchResult& r);
/// "POLICY (why)", the policy between `open` and `close`; "none (why)" without one.
std::string recommendation_text(const BenchResult& r, const std::string& open, const std::string& close);
/// The bench section of the console report.
std::vector<std::string> bench_lines(const BenchResult& r);
/// Memory against time per policy, as an SVG scatter chart with min..max time bars.
std::string bench_svg(const BenchResult& r);

/// One row of the plan report's table of plans: what was predicted, what was measured.
struct PlanRow {
  std::string policy, units, predicted_peak, measured_peak, peak_error, predicted_time, measured_time, checks, outcome;
};
std::vector<PlanRow> plan_rows(const MemoryPlan& p);
/// One row per candidate site of the profile: input, activations a checkpoint frees, what it adds in
/// the backward, the time it adds.
struct SiteRow {
  std::string site, input, kept, extra, recompute;
};
std::vector<SiteRow> plan_site_rows(const MemoryPlan& p);
/// One row per op class the selective plans weigh: calls, what saving it keeps, what it spares.
struct OpClassRow {
  std::string op, calls, keeps, spares;
};
std::vector<OpClassRow> plan_op_class_rows(const MemoryPlan& p);
/// Why the selective plans weigh no op class, or how many classes they leave aside ("" otherwise).
std::string plan_op_class_note(const MemoryPlan& p);
/// Budget, baseline, the plain step's peak and the profile, in one sentence.
std::string plan_header(const MemoryPlan& p);
/// "POLICY (why)", the plan between `open` and `close`; "no plan (why)" without one.
std::string plan_recommendation_text(const MemoryPlan& p, const std::string& open, const std::string& close);
/// What the profile could not measure, in a sentence ("" when it measured everything).
std::string plan_profile_note(const MemoryPlan& p);
/// The plan section of the console report.
std::vector<std::string> plan_lines(const MemoryPlan& p, const std::string& run_command);

/// The selftest's detection matrix (a class per row, a planted site per column), the counts, what
/// it cost, and the command of each cell missed, as the console and the fenced blocks show them.
std::vector<std::string> selftest_lines(const SelftestResult& s);

}  // namespace ckcheck
