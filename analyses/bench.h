// ckcheck bench: the memory and time of each checkpoint policy, beside the analytic activation
// memory, and the policy to use. The field guide's advice -- measure peak memory and step time,
// tighten while memory is short, loosen while there is room, expect 20-40 % slowdown, suspect
// anything over 50 % -- done for the user.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checks/check.h"
#include "checks/overhead.h"
#include "harness/runner/plan.h"
#include "harness/runner/runner.h"

namespace ckcheck {

struct PolicyBench {
  std::string policy;
  std::vector<std::string> checkpointed;
  Measurement measurement;
  std::optional<double> analytic_bytes;  // activation memory the formula predicts
  double time_median_s = 0, time_min_s = 0, time_max_s = 0, forward_median_s = 0;
  /// Step time against `none`'s, measured interleaved: the ratio of the means of the fastest 30% of steps and its 95%
  /// bootstrap interval (see fast_ratio; 1, 1, 1 for none itself).
  double time_ratio = 1, time_ratio_low = 1, time_ratio_high = 1;
  /// Step-to-step spread of the wall-clock step time: standard deviation over mean.
  double time_spread = 0;
  /// The same ratio on the process's CPU time, and on instructions where they are counted.
  double cpu_ratio = 1, cpu_ratio_low = 1, cpu_ratio_high = 1;
  std::optional<double> instructions_ratio;
  double cpu_median_s = 0;
  bool fits = true;
  std::string note;  // why it was not measured, or what stopped it
  /// The checks of `ckcheck run` on this policy's checkpointed step against the plain one: pass,
  /// fail or error; none where nothing is checkpointed (none) or the step was not measured. A
  /// policy that does not pass is measured and shown, never ranked.
  std::optional<Verdict> checks;
  /// The checks that did not pass, each as "id: cause at site" (its first finding).
  std::vector<std::string> check_failures;
  /// Ranked: measured, passes its checks (or has nothing to check), and is the policy that stands
  /// for its memory class (see recommend). Set by recommend.
  bool ranked = false;
  /// Where not ranked though measured, why (set by recommend).
  std::string not_ranked;
  /// Under a data-parallel engine (bench --parallel): each rank's peak above its step's start
  /// through the engine, in rank order (-1 where the step failed); `measurement` is then the whole
  /// module alone on rank 0's shard of the batch.
  std::vector<int64_t> rank_peak_bytes;
  bool measured() const { return note.empty() || !measurement.step_seconds.empty(); }
};

struct BenchOptions {
  std::vector<std::string> policies;  // policy strings; empty: the default list
  int64_t warmup = 2;
  int64_t steps = 10;  // measured rounds: one step of every policy per round, interleaved
  /// When a policy that does more work than none measures faster than none beyond the noise,
  /// more rounds are measured, until this many seconds of measuring have passed.
  double time_budget_s = 60;
  int64_t memory_budget_bytes = -1;  // total for the step (baseline + peak); -1: none
  /// The field guide's line between acceptable and too fine: the overhead check's knob.
  double max_overhead = max_overhead_knob().default_value;
  /// Run the checks on each policy's checkpointed step before ranking it (bench never ranks a
  /// policy whose step fails a correctness check); with what equality.
  bool verify = true;
  Tolerance tolerance;
  /// Verdicts already known (policy text -> checks verdict and failures, as PolicyBench has them):
  /// those policies are not checked again (ckcheck plan checks its plans before measuring them).
  std::map<std::string, std::pair<std::optional<Verdict>, std::vector<std::string>>> known_checks;
  /// The `ckcheck run` command of this model without --policy: where the findings of a policy that
  /// fails its checks are seen in full.
  std::string check_command;
  /// Called before each policy is measured (for a progress bar).
  std::function<void(size_t index, size_t total, const std::string& policy)> progress;
};

struct BenchResult {
  std::string device;
  int64_t baseline_bytes = 0;   // parameters, gradients and inputs
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t adam_state_bytes = 0;  // what Adam's two fp32 moments would add
  int64_t memory_budget_bytes = -1;
  double max_overhead = max_overhead_knob().default_value;  // BenchOptions::max_overhead, as used
  std::string formula;
  std::vector<PolicyBench> policies;
  int64_t rounds = 0;        // measured rounds, extra ones included
  std::string clock;         // which clock each time figure uses
  bool too_noisy = false;    // time could not be trusted: only the memory verdict stands
  std::string check_command;  // BenchOptions::check_command
  /// --offload: where every checkpointing policy's saved activations go ("" when not offloaded),
  /// and what the peaks mean then on this device.
  std::string offload, offload_note;
  /// bench --parallel: the engine ("fsdp", "ddp"; "" in one process), the ranks, and what each
  /// rank's figures mean.
  std::optional<ParallelKind> parallel;  // the engine a per-rank bench measured through
  int world_size = 1;
  std::string parallel_note;
  /// bench --parallel: the parameters and gradients each rank holds before its step (FSDP2: its
  /// shards, about 1/world_size; DDP: all), beside which each rank's peak stands.
  int64_t rank_state_bytes = 0;
  std::string recommendation;
  std::string reason;
  std::vector<std::string> warnings;
};

/// The checks that did not pass, each as "id: cause at site" (its first finding) or "id: summary"
/// (a check without findings): what PolicyBench::check_failures holds.
std::vector<std::string> check_failures(const std::vector<CheckResult>& results);

/// The policies `ckcheck bench` measures when none are given.
const std::vector<std::string>& default_bench_policies();

/// Peak activation memory the model's formula predicts under a plan: the forward keeps the
/// activations of sites that are not checkpointed and the inputs of those that are; the backward,
/// walking back, rebuilds one checkpointed unit at a time on top of what the sites before it
/// keep. Every block checkpointed gives n*x + A. Empty when the model has no formula.
std::optional<double> analytic_activation_bytes(const Model& model, const Plan& plan, int element_bytes);

/// Measures every policy through the runner: each one's warm-up, then the measured steps
/// round-robin (one step of each policy per round, in an order rotated every round), so that every
/// policy sees the same slice of the machine's load. `none` is always measured, as the reference
/// of the ratios. Policies given explicitly must apply to the model (UsageError otherwise);
/// default ones that do not are listed with a note.
BenchResult run_bench(Runner& runner, const std::vector<std::string>& site_globs, const BenchOptions& options);

/// bench under the model's data-parallel engine (bench --parallel), every rank calling it with the
/// same options: each policy's memory on this rank's shard of the batch, through the engine and by
/// the whole module alone, in the same order on every rank (the engine's collectives keep the
/// ranks in step). `group` gathers the ranks' peaks on rank 0 (PolicyBench::rank_peak_bytes).
/// Memory only: the ranks share this machine, so no time is ranked and no policy recommended.
BenchResult run_bench_per_rank(Runner& runner, const std::vector<std::string>& site_globs, const BenchOptions& options,
                               Collective& group);

/// How much slower `num`'s steps are than `den`'s: the ratio of the means of their fastest 30% of steps, with a 95%
/// bootstrap interval (fixed seed: the same samples give the same interval). Other processes only
/// ever add time to a step, so the fastest steps estimate the step on a quiet machine far more
/// stably than a mean or median does. {ratio, low, high}; {1, 1, 1} for identical samples.
std::array<double, 3> fast_ratio(const std::vector<double>& num, const std::vector<double>& den);

/// Withholds the time verdict (too_noisy, and a warning naming each policy and its interval) when
/// a policy's time ratio is known only to more than +-8% of none's step, the widest interval at
/// which the ranking's advice stayed stable run to run. run_bench calls it after its last round.
void withhold_imprecise_times(BenchResult& result);

/// The recommendation and warnings, from the measurements and checks (run_bench calls it). Only
/// policies that pass their checks are ranked. Peaks within kMemoryResolution of the largest form
/// one memory class, for which the policy that recomputes least stands (fewest checkpointed sites;
/// a compiler's budget: the larger; then the order measured): decided by the plan, not the clock.
/// Time differences within kTimeResolution do not rank policies: memory decides between them.
void recommend(BenchResult& result);

/// The policy `none` when it was measured: the reference of every ratio (null otherwise).
const PolicyBench* measured_none(const BenchResult& result);
/// A policy's peak memory as a fraction of none's (1 when none allocated nothing).
double peak_ratio(const PolicyBench& policy, const PolicyBench& none);

}  // namespace ckcheck
