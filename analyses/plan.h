// ckcheck plan: the fastest checkpoint plan under a memory budget, verified before it is
// recommended. Each candidate site is profiled once (what a checkpoint there frees, what its
// recompute costs, where the step peaks); an exact dynamic program over the sites finds the plan
// that recomputes least and whose predicted peak fits; that plan's checkpointed step is checked
// against the plain one and measured interleaved with `none`. A plan that fails a check is never
// recommended: the sites its findings name are set aside and the next plan is solved and verified.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "analyses/bench.h"
#include "harness/runner/profile.h"

namespace ckcheck {

/// A plan's predicted peak above the baseline: the largest over the profile's stretches of the
/// plain step's peak there, less what the checkpointed sites among those holding then would keep,
/// plus, in a checkpointed site's backward, what its checkpoint adds there (measured: the
/// recomputed outputs, gradients handed back). `where`: the stretch that decides it.
int64_t predict_peak(const StepProfile& profile, const std::vector<bool>& checkpointed, std::string* where = nullptr);
/// A plan's predicted step time: the plain step plus what a checkpoint at each checkpointed site
/// was measured to add.
double predict_seconds(const StepProfile& profile, const std::vector<bool>& checkpointed);

struct SolverStats {
  int64_t states = 0;       // (bytes freed, time) pairs kept, summed over the sites
  int64_t largest_front = 0;  // the most pairs kept after one site
};

/// The plan that adds the least recompute time among those whose predicted peak above the
/// baseline is at most `budget_bytes`, never checkpointing a site in `excluded`: an exact dynamic
/// program over the sites in forward order, keeping for each prefix the pairs (bytes freed so far,
/// time added) that no other pair beats on both -- every constraint reads only the bytes freed by
/// the sites before a stretch, so the pairs dropped can never lead to a better plan. O(n * F) time
/// and O(F) memory for n sites and a front of at most F pairs (F <= the distinct sums of the bytes
/// the sites free, n + 1 for identical blocks). nullopt when no plan fits.
std::optional<std::vector<bool>> solve_plan(const StepProfile& profile, int64_t budget_bytes,
                                            const std::set<size_t>& excluded = {}, SolverStats* stats = nullptr);

/// A selective plan (sac:OPS[@SITES]): the sites `sites` checkpointed with the op classes `saved`
/// (indices into profile.op_classes) saved and every other op recomputed. A site then frees what
/// its checkpoint frees less what it saves, and its recompute costs the saved ops' time less; its
/// backward is taken to hold what its whole checkpoint's does (an upper bound: the saved ops are not
/// recomputed there).
struct SacPlan {
  std::vector<bool> sites;
  std::vector<size_t> saved;
};
int64_t predict_sac_peak(const StepProfile& profile, const SacPlan& plan, std::string* where = nullptr);
double predict_sac_seconds(const StepProfile& profile, const SacPlan& plan);

/// At most this many op classes (those taking most time) are weighed by solve_sac_plan.
constexpr size_t kSacClasses = 12;

/// The selective plan that adds the least time among those whose predicted peak fits `budget_bytes`,
/// never checkpointing a site in `excluded` and never one whose policy is in `failed`: for each
/// non-empty subset of the (at most kSacClasses) op classes that take most time, solve_plan's
/// dynamic program over the sites with that subset's figures -- O(2^K * n * F) for K classes.
/// Of plans equal in time, the fewest ops, then the lowest predicted peak. nullopt when none fits,
/// or when checkpointing nothing fits (no plan adds less time than none).
/// `evaluated`: subsets weighed, added to.
std::optional<SacPlan> solve_sac_plan(const StepProfile& profile, int64_t budget_bytes, const std::set<size_t>& excluded = {},
                                      const std::set<std::string>& failed = {}, int64_t* evaluated = nullptr);
/// sac:OP+OP over the op classes saved, with @SITE+SITE when not every site is checkpointed.
std::string sac_policy(const StepProfile& profile, const SacPlan& plan);

/// The policy string of a plan over the profile's sites: none, every:1 (all of them) or
/// sites:A,B,...
std::string plan_policy(const StepProfile& profile, const std::vector<bool>& checkpointed);

/// One plan the solver proposed, and what verifying it showed.
struct PlanAttempt {
  std::string policy;
  std::vector<std::string> sites;   // checkpointed
  std::vector<std::string> saved_ops;  // a selective plan (sac:OPS): the op classes saved
  int64_t predicted_peak_bytes = 0;  // above the baseline
  std::string peak_where;            // the stretch the prediction's peak falls in
  double predicted_seconds = 0.0;
  std::optional<Verdict> checks;          // pass, fail, error; none when nothing is checkpointed
  std::vector<std::string> check_failures;  // "id: cause at site"
  std::vector<std::string> set_aside;       // sites the next plans leave alone because of it
  std::string outcome;                       // what became of it, in words
};

struct PlanOptions {
  int64_t memory_budget_bytes = 0;  // the step's total: baseline + peak
  int64_t profile_warmup = 1, profile_steps = 3;
  BenchOptions bench;  // the interleaved measurement of the plans against none (its policies are set here)
  int64_t max_attempts = 8;
};

struct MemoryPlan {
  int64_t memory_budget_bytes = 0;
  StepProfile profile;
  std::string solver;  // which solver, with its complexity
  SolverStats stats;
  int64_t sac_subsets = 0;  // op-class subsets weighed for selective plans
  std::vector<PlanAttempt> attempts;
  /// none and every plan proposed, measured interleaved; each plan with the checks it was verified by.
  BenchResult measured;
  std::string recommendation;  // a policy string run and bench accept; "" when none fits
  std::string reason;
  bool fits = false;  // the recommended plan's measured peak is within the budget
};

/// The row of `policy` in plan.measured, or null when it was not measured (its step threw).
const PolicyBench* measured_plan(const MemoryPlan& plan, const std::string& policy);

/// Profiles the candidate sites (the outermost sites the --sites globs or the model's defaults
/// give) and, where the checkpoint under test takes an op-level policy, the op classes they run;
/// then solves (the module plan and the selective plan, the faster predicted first), verifies and
/// measures until a plan passes its checks, or no plan is left.
MemoryPlan make_memory_plan(Runner& runner, const std::vector<std::string>& site_globs, const PlanOptions& options);

}  // namespace ckcheck
