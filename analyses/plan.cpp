#include "analyses/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "analyses/session.h"
#include "harness/support/errors.h"
#include "harness/support/text.h"

namespace ckcheck {
namespace {

int64_t region_peak(const StepProfile& p, const PeakRegion& r, int64_t freed, bool recomputed) {
  return r.peak_bytes - freed + (recomputed ? p.sites[*r.recomputes].recompute_extra_bytes : 0);
}

// Sites alike in memory (the same input, output, activations kept and forward peak: repeated
// blocks) cost the same: the median of their recompute times. Which of identical blocks a plan takes is
// then decided by memory, never by the clock's noise.
std::vector<double> grouped_costs(const StepProfile& p, const std::vector<double>& raw) {
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::vector<size_t>> groups;
  for (size_t i = 0; i < p.sites.size(); ++i) {
    const auto& c = p.sites[i];
    groups[{c.input_bytes, c.output_bytes, c.kept_bytes, c.forward_peak_bytes}].push_back(i);
  }
  std::vector<double> cost(p.sites.size(), 0.0);
  for (const auto& [key, members] : groups) {
    std::vector<double> times;
    for (size_t i : members) times.push_back(raw[i]);
    const double m = median(times);
    for (size_t i : members) cost[i] = m;
  }
  return cost;
}

struct State {
  int64_t freed = 0;    // bytes the sites taken so far free
  double cost = 0.0;    // recompute time they add
  int64_t peak = 0;     // the predicted peak of the stretches decided so far (a tie-break only)
  std::vector<bool> taken;
};

bool same_cost(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({1.0, std::abs(a), std::abs(b)}); }

// Keeps the states no other beats on both bytes freed and time added; of two with the same pair,
// the one whose stretches so far peak lower.
std::vector<State> pareto(std::vector<State> states) {
  std::sort(states.begin(), states.end(), [](const State& a, const State& b) {
    if (a.freed != b.freed) return a.freed > b.freed;
    if (!same_cost(a.cost, b.cost)) return a.cost < b.cost;
    return a.peak < b.peak;
  });
  std::vector<State> front;
  std::optional<double> best;
  for (auto& s : states) {
    if (!best || (s.cost < *best && !same_cost(s.cost, *best))) {
      best = s.cost;
      front.push_back(std::move(s));
    }
  }
  return front;
}

std::string site_of_finding(const std::string& found, const std::vector<std::string>& sites) {
  for (const auto& s : sites) {
    if (found == s || found.rfind(s + ".", 0) == 0 || s.rfind(found + ".", 0) == 0) return s;
  }
  return "";
}

}  // namespace

namespace {

// The predicted peak when site j frees freed[j] and its backward recomputes it when recomputed[j].
int64_t peak_of(const StepProfile& p, const std::vector<int64_t>& freed, const std::vector<bool>& recomputed,
                std::string* where) {
  std::vector<int64_t> prefix(p.sites.size() + 1, 0);
  for (size_t j = 0; j < p.sites.size(); ++j) prefix[j + 1] = prefix[j] + freed[j];
  int64_t peak = 0;
  for (const auto& r : p.regions) {
    const bool recompute = r.recomputes && recomputed[*r.recomputes];
    const int64_t v = region_peak(p, r, prefix[std::min(r.holding, p.sites.size())], recompute);
    if (v > peak || (where && where->empty())) {
      peak = std::max(peak, v);
      if (where) *where = r.where;
    }
  }
  return peak;
}

// What a checkpoint at each site frees and adds in time, for the plans of one family: whole
// checkpoints (nothing saved) or selective ones saving the op classes `saved`.
struct Figures {
  std::vector<int64_t> frees;
  std::vector<double> cost;      // grouped (the solver's)
  std::vector<double> seconds;   // as measured (the prediction's)
};

Figures figures_of(const StepProfile& p, const std::vector<size_t>& saved) {
  Figures f;
  for (size_t j = 0; j < p.sites.size(); ++j) {
    int64_t kept = 0;
    double spared = 0.0;
    for (size_t c : saved) {
      kept += p.op_classes[c].site_bytes[j];
      spared += p.op_classes[c].site_seconds[j];
    }
    f.frees.push_back(std::max<int64_t>(0, p.sites[j].kept_bytes - kept));
    f.seconds.push_back(std::max(0.0, p.sites[j].recompute_seconds - spared));
  }
  f.cost = grouped_costs(p, f.seconds);
  return f;
}

std::vector<int64_t> freed_by(const Figures& f, const std::vector<bool>& s) {
  std::vector<int64_t> freed(s.size());
  for (size_t j = 0; j < s.size(); ++j) freed[j] = s[j] ? f.frees[j] : 0;
  return freed;
}

double seconds_of(const StepProfile& p, const Figures& f, const std::vector<bool>& s) {
  double t = p.step_seconds;
  for (size_t i = 0; i < s.size(); ++i) t += s[i] ? f.seconds[i] : 0.0;
  return t;
}

// The exact dynamic program of solve_plan over one family's figures; the best state.
std::optional<State> solve_sites(const StepProfile& p, const Figures& f, int64_t budget, const std::set<size_t>& excluded,
                                 SolverStats* stats) {
  const size_t n = p.sites.size();
  // The stretches by the number of sites before them that hold their activations.
  std::vector<std::vector<const PeakRegion*>> at(n + 1);
  for (const auto& r : p.regions) at[std::min(r.holding, n)].push_back(&r);
  auto check = [&](State& s, size_t k, std::optional<bool> taking) {
    for (const auto* r : at[k]) {
      const bool recompute = r->recomputes.has_value();
      if (recompute != taking.has_value()) continue;
      const int64_t v = region_peak(p, *r, s.freed, recompute && *taking);
      if (v > budget) return false;
      s.peak = std::max(s.peak, v);
    }
    return true;
  };
  std::vector<State> front{State{0, 0.0, 0, std::vector<bool>(n, false)}};
  SolverStats local;
  for (size_t k = 0; k <= n && !front.empty(); ++k) {
    std::vector<State> next;
    for (auto s : front) {
      if (!check(s, k, std::nullopt)) continue;  // the stretches before site k's forward
      if (k == n) {
        next.push_back(std::move(s));
        continue;
      }
      for (const bool take : {false, true}) {
        if (take && (excluded.count(k) || f.frees[k] <= 0)) continue;
        State t = s;
        if (!check(t, k, take)) continue;  // site k's backward, recomputing it when taken
        if (take) {
          t.freed += f.frees[k];
          t.cost += f.cost[k];
          t.taken[k] = true;
        }
        next.push_back(std::move(t));
      }
    }
    front = pareto(std::move(next));
    local.states += static_cast<int64_t>(front.size());
    local.largest_front = std::max<int64_t>(local.largest_front, static_cast<int64_t>(front.size()));
  }
  if (stats) *stats = local;
  if (front.empty()) return std::nullopt;
  // The least time added; of plans equal in time, the fewest sites, then the lowest predicted peak.
  const auto peak = [&](const State& s) { return peak_of(p, freed_by(f, s.taken), s.taken, nullptr); };
  const auto best = std::min_element(front.begin(), front.end(), [&](const State& a, const State& b) {
    if (!same_cost(a.cost, b.cost)) return a.cost < b.cost;
    const auto na = std::count(a.taken.begin(), a.taken.end(), true), nb = std::count(b.taken.begin(), b.taken.end(), true);
    if (na != nb) return na < nb;
    return peak(a) < peak(b);
  });
  return *best;
}

}  // namespace

int64_t predict_peak(const StepProfile& p, const std::vector<bool>& s, std::string* where) {
  return peak_of(p, freed_by(figures_of(p, {}), s), s, where);
}

double predict_seconds(const StepProfile& p, const std::vector<bool>& s) { return seconds_of(p, figures_of(p, {}), s); }

int64_t predict_sac_peak(const StepProfile& p, const SacPlan& plan, std::string* where) {
  return peak_of(p, freed_by(figures_of(p, plan.saved), plan.sites), plan.sites, where);
}

double predict_sac_seconds(const StepProfile& p, const SacPlan& plan) {
  return seconds_of(p, figures_of(p, plan.saved), plan.sites);
}

std::optional<std::vector<bool>> solve_plan(const StepProfile& p, int64_t budget, const std::set<size_t>& excluded,
                                            SolverStats* stats) {
  const auto best = solve_sites(p, figures_of(p, {}), budget, excluded, stats);
  if (!best) return std::nullopt;
  return best->taken;
}

std::optional<SacPlan> solve_sac_plan(const StepProfile& p, int64_t budget, const std::set<size_t>& excluded,
                                      const std::set<std::string>& failed, int64_t* evaluated) {
  const size_t k = std::min(kSacClasses, p.op_classes.size());
  std::optional<SacPlan> best;
  double best_cost = 0.0;
  int64_t best_peak = 0;
  for (uint32_t mask = 1; mask < (1u << k); ++mask) {
    SacPlan plan;
    for (size_t c = 0; c < k; ++c) {
      if (mask & (1u << c)) plan.saved.push_back(c);
    }
    if (evaluated) ++*evaluated;
    const auto f = figures_of(p, plan.saved);
    const auto s = solve_sites(p, f, budget, excluded, nullptr);
    if (!s || std::none_of(s->taken.begin(), s->taken.end(), [](bool b) { return b; })) continue;
    plan.sites = s->taken;
    if (failed.count(sac_policy(p, plan))) continue;
    const int64_t peak = peak_of(p, freed_by(f, s->taken), s->taken, nullptr);
    // The least time added; then the fewest ops saved, then the lowest predicted peak.
    const bool better = !best || (!same_cost(s->cost, best_cost) && s->cost < best_cost) ||
                        (same_cost(s->cost, best_cost) &&
                         (plan.saved.size() < best->saved.size() || (plan.saved.size() == best->saved.size() && peak < best_peak)));
    if (better) {
      best = plan;
      best_cost = s->cost;
      best_peak = peak;
    }
  }
  return best;
}

std::string sac_policy(const StepProfile& p, const SacPlan& plan) {
  std::vector<std::string> ops, sites;
  for (size_t c : plan.saved) ops.push_back(p.op_classes[c].op);
  std::sort(ops.begin(), ops.end());
  for (size_t i = 0; i < p.sites.size(); ++i) {
    if (plan.sites[i]) sites.push_back(p.sites[i].site);
  }
  const bool all = sites.size() == p.sites.size();
  return "sac:" + fmt::format("{}", fmt::join(ops, "+")) + (all ? "" : "@" + fmt::format("{}", fmt::join(sites, "+")));
}

std::string plan_policy(const StepProfile& p, const std::vector<bool>& s) {
  std::vector<std::string> sites;
  for (size_t i = 0; i < p.sites.size(); ++i) {
    if (s[i]) sites.push_back(p.sites[i].site);
  }
  if (sites.empty()) return "none";
  if (sites.size() == p.sites.size()) return "every:1";
  return "sites:" + fmt::format("{}", fmt::join(sites, ","));
}

const PolicyBench* measured_plan(const MemoryPlan& plan, const std::string& policy) {
  const auto text = Policy::parse(policy).text();
  for (const auto& b : plan.measured.policies) {
    if (b.policy == text && !b.measurement.step_seconds.empty()) return &b;
  }
  return nullptr;
}

namespace {

std::string budget_text(const PlanOptions& o) { return format_bytes(static_cast<double>(o.memory_budget_bytes)); }

// The search for a plan: solve for the budget, check the plan, set aside the sites its findings
// name and solve again, until one passes; then measure every plan so far against none and accept
// the passing one whose measured peak fits (or solve again for a budget smaller by the excess).
class Planner {
 public:
  Planner(Runner& runner, const std::vector<std::string>& site_globs, const PlanOptions& options)
      : runner_(runner), model_(runner.model()), globs_(site_globs), options_(options) {}

  MemoryPlan plan() {
    out_.memory_budget_bytes = options_.memory_budget_bytes;
    profile();
    budget_ = options_.memory_budget_bytes - out_.profile.baseline_bytes;
    if (budget_ < 0) {
      out_.reason = fmt::format("no plan fits in {}: parameters, gradients and inputs alone take {}", budget_text(options_),
                                format_bytes(static_cast<double>(out_.profile.baseline_bytes)));
      return std::move(out_);
    }
    for (int64_t round = 0; round < 3; ++round) {
      solve_and_check();
      if (!accepted_ || measure_round()) break;
    }
    conclude();
    out_.measured.recommendation = out_.recommendation;
    out_.measured.reason = out_.reason;
    return std::move(out_);
  }

 private:
  Runner& runner_;
  Model& model_;
  const std::vector<std::string>& globs_;
  const PlanOptions& options_;
  MemoryPlan out_;
  int64_t budget_ = 0;
  std::set<size_t> excluded_;
  std::set<std::string> sac_failed_;  // selective plans that failed their checks
  std::map<std::string, std::pair<std::optional<Verdict>, std::vector<std::string>>> known_;
  int64_t margin_ = 0;  // taken off the budget after a plan measured over it
  std::optional<size_t> accepted_;
  // A selective plan's op-level policy runs in Python around every op, a cost no profile of the
  // ops shows: the module plan it was preferred to is verified and measured beside it.
  std::optional<size_t> rival_;
  bool rival_fits_alone_ = false;  // the module plan fits when measured, its selective rival does not

  void profile() {
    out_.solver =
        "exact dynamic program over the sites in forward order, keeping per prefix the (bytes freed, time added) pairs "
        "no other beats on both: O(n*F) for n sites and a front of F pairs";
    const auto candidates = Plan::make(model_, globs_, Policy::parse("every:1")).candidates;
    out_.profile = profile_sites(runner_, candidates, options_.profile_warmup, options_.profile_steps);
    if (!out_.profile.error.empty()) {
      throw UsageError("the model's plain training step fails, so it cannot be profiled: " + out_.profile.error);
    }
    // Selective plans, where the checkpoint under test takes an op-level policy.
    if (!model_.selective_problem({"aten.mm"}).empty()) {
      out_.profile.op_classes_note = "no selective (sac:OPS) plans: they need torch.utils.checkpoint's non-reentrant "
                                     "checkpoint on a Python model trained eagerly";
      return;
    }
    profile_op_classes(runner_, out_.profile, options_.profile_warmup, options_.profile_steps);
    if (!out_.profile.op_classes.empty()) {
      out_.solver += fmt::format("; selective plans (sac:OPS@SITES): exhaustive over the subsets of the {} op "
                                 "classes that take most time, the same program over the sites for each: O(2^K*n*F)",
                                 std::min(kSacClasses, out_.profile.op_classes.size()));
    }
  }

  // Runs the checks on a plan; the sites the failing checks name.
  std::set<std::string> verify(PlanAttempt& a) {
    const auto plan = Plan::make(model_, globs_, Policy::parse(a.policy));
    const auto outcome = run_checks(runner_, plan, options_.bench.tolerance, select_checks({}));
    a.checks = verdict_of(outcome.results);
    a.check_failures = check_failures(outcome.results);
    std::set<std::string> named;
    for (const auto& c : outcome.results) {
      if (c.status != Status::kFail && c.status != Status::kError) continue;
      // A step that threw says where ("the checkpointed step threw at blocks.0: ...").
      for (const auto& site : a.sites) {
        if (c.findings.empty() && names_site(c.summary, site)) named.insert(site);
      }
      for (const auto& g : c.findings) {
        const auto site = site_of_finding(g.site, a.sites);
        if (!site.empty()) named.insert(site);
      }
    }
    known_[Policy::parse(a.policy).text()] = {a.checks, a.check_failures};
    return named;
  }

  PlanAttempt module_attempt(const std::vector<bool>& s) const {
    const auto& prof = out_.profile;
    PlanAttempt a;
    a.policy = plan_policy(prof, s);
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i]) a.sites.push_back(prof.sites[i].site);
    }
    a.predicted_peak_bytes = predict_peak(prof, s, &a.peak_where);
    a.predicted_seconds = predict_seconds(prof, s);
    return a;
  }

  PlanAttempt sac_attempt(const SacPlan& sac) const {
    const auto& prof = out_.profile;
    PlanAttempt a;
    a.policy = sac_policy(prof, sac);
    for (size_t i = 0; i < prof.sites.size(); ++i) {
      if (sac.sites[i]) a.sites.push_back(prof.sites[i].site);
    }
    for (size_t c : sac.saved) a.saved_ops.push_back(prof.op_classes[c].op);
    std::sort(a.saved_ops.begin(), a.saved_ops.end());
    a.predicted_peak_bytes = predict_sac_peak(prof, sac, &a.peak_where);
    a.predicted_seconds = predict_sac_seconds(prof, sac);
    return a;
  }

  // The next plan the solvers give for the budget left, and the module plan a selective one was
  // preferred to; nothing when no plan is predicted to fit.
  std::optional<std::pair<PlanAttempt, std::optional<PlanAttempt>>> propose() {
    SolverStats stats;
    const auto& prof = out_.profile;
    const auto s = solve_plan(prof, budget_ - margin_, excluded_, &stats);
    out_.stats.states += stats.states;
    out_.stats.largest_front = std::max(out_.stats.largest_front, stats.largest_front);
    const auto sac = solve_sac_plan(prof, budget_ - margin_, excluded_, sac_failed_, &out_.sac_subsets);
    if (!s && !sac) return std::nullopt;
    PlanAttempt a = s ? module_attempt(*s) : PlanAttempt{};
    std::optional<PlanAttempt> module_plan;
    // The selective plan where it is predicted faster (the module plan on a tie: it is simpler).
    if (sac && (!s || (predict_sac_seconds(prof, *sac) < a.predicted_seconds &&
                       !same_cost(predict_sac_seconds(prof, *sac), a.predicted_seconds)))) {
      if (s && !a.sites.empty()) module_plan = a;
      a = sac_attempt(*sac);
    }
    return std::make_pair(std::move(a), std::move(module_plan));
  }

  // A plan that failed its checks: the sites the findings name are left alone by the next plans
  // (where they name none, every site of the plan; a selective plan naming none is set aside alone).
  void set_aside(PlanAttempt& a, const std::set<std::string>& named) {
    const auto& prof = out_.profile;
    if (!a.saved_ops.empty()) sac_failed_.insert(a.policy);
    if (!named.empty()) {
      a.set_aside.assign(named.begin(), named.end());
    } else if (a.saved_ops.empty()) {
      a.set_aside = a.sites;
    }
    for (size_t i = 0; i < prof.sites.size(); ++i) {
      if (std::count(a.set_aside.begin(), a.set_aside.end(), prof.sites[i].site)) excluded_.insert(i);
    }
    a.outcome = fmt::format("not recommended: {} its checks ({}); {}", a.checks == Verdict::kFail ? "fails" : "cannot pass",
                            fmt::join(a.check_failures, "; "),
                            a.set_aside.empty() ? "the next plan is another"
                                                : fmt::format("the next plan leaves {} alone", fmt::join(a.set_aside, ", ")));
    out_.attempts.push_back(a);
  }

  // The module plan a selective plan was preferred to, verified and kept beside it when it passes.
  void keep_rival(PlanAttempt module_plan) {
    rival_.reset();
    const auto seen = std::find_if(out_.attempts.begin(), out_.attempts.end(),
                                   [&](const PlanAttempt& b) { return b.policy == module_plan.policy; });
    if (seen != out_.attempts.end()) {
      if (seen->checks == Verdict::kPass) rival_ = static_cast<size_t>(seen - out_.attempts.begin());
      return;
    }
    verify(module_plan);
    if (module_plan.checks == Verdict::kPass) {
      module_plan.outcome = "not recommended: the module plan the selective one was preferred to, measured beside it";
      out_.attempts.push_back(module_plan);
      rival_ = out_.attempts.size() - 1;
    }
  }

  // Solve and check until a plan passes its checks (accepted_), or none is left.
  void solve_and_check() {
    accepted_.reset();
    while (static_cast<int64_t>(out_.attempts.size()) < options_.max_attempts) {
      auto proposed = propose();
      if (!proposed) return;
      auto& [a, module_plan] = *proposed;
      const bool repeated = std::any_of(out_.attempts.begin(), out_.attempts.end(),
                                        [&](const PlanAttempt& b) { return b.policy == a.policy; });
      if (repeated) return;
      if (!a.sites.empty()) {
        const auto named = verify(a);
        if (a.checks == Verdict::kError && named.empty()) {
          // The checks cannot judge this model's checkpointed step, and no site is to blame (its
          // plain step does not repeat, say): no other plan would be judged either.
          a.outcome = fmt::format("not recommended: the checks cannot judge it ({}); no plan is verified",
                                  fmt::join(a.check_failures, "; "));
          out_.attempts.push_back(a);
          out_.reason = "no plan can be verified: the checks cannot judge this model's checkpointed step (" +
                        fmt::format("{}", fmt::join(a.check_failures, "; ")) + ")";
          return;
        }
        if (a.checks != Verdict::kPass) {
          set_aside(a, named);
          continue;
        }
      }
      out_.attempts.push_back(a);
      accepted_ = out_.attempts.size() - 1;
      rival_.reset();
      if (module_plan) keep_rival(*module_plan);
      return;
    }
  }

  // Every plan proposed so far measured against none, interleaved, each with its checks' verdict.
  void measure_all() {
    auto bench = options_.bench;
    bench.policies = {"none"};
    for (const auto& a : out_.attempts) {
      if (std::find(bench.policies.begin(), bench.policies.end(), a.policy) == bench.policies.end()) {
        bench.policies.push_back(a.policy);
      }
    }
    bench.memory_budget_bytes = options_.memory_budget_bytes;
    bench.known_checks = known_;
    out_.measured = run_bench(runner_, globs_, bench);
  }

  // Measures the accepted plan; true when the search ends (a plan fits, or it cannot be measured).
  bool measure_round() {
    measure_all();
    auto& chosen = out_.attempts[*accepted_];
    const auto* it = measured_plan(out_, chosen.policy);
    if (!it) {
      std::string why;
      for (const auto& b : out_.measured.policies) {
        if (b.policy == Policy::parse(chosen.policy).text()) why = ": " + b.note + b.measurement.error;
      }
      chosen.outcome = "not recommended: its step could not be measured" + why;
      accepted_.reset();
      return true;
    }
    const auto* other = rival_ ? measured_plan(out_, out_.attempts[*rival_].policy) : nullptr;
    const bool other_fits = other && other->fits &&
                            other->measurement.baseline_bytes + other->measurement.peak_bytes <= options_.memory_budget_bytes;
    if (it->measurement.baseline_bytes + it->measurement.peak_bytes <= options_.memory_budget_bytes && it->fits) {
      fits(chosen, *it, other_fits ? other : nullptr);
      return true;
    }
    return over_budget(chosen, *it, other_fits);
  }

  // The accepted plan fits when measured: recommended -- or the module plan beside it, where it fits
  // too and is measured faster beyond doubt (the intervals apart).
  void fits(PlanAttempt& chosen, const PolicyBench& it, const PolicyBench* other) {
    chosen.outcome = chosen.sites.empty() ? "recommended: nothing to check; the plain step's measured peak is within the budget"
                                          : "recommended: passes its checks; its measured peak is within the budget";
    if (other && other->time_ratio_high < it.time_ratio_low) {
      chosen.outcome = fmt::format("not recommended: passes its checks and fits, but measured slower ({:.2f}x none) than {} "
                                   "({:.2f}x): the op-level policy's own cost",
                                   it.time_ratio, out_.attempts[*rival_].policy, other->time_ratio);
      out_.attempts[*rival_].outcome = "recommended: passes its checks; its measured peak is within the budget, and it is "
                                       "measured faster than the selective plan";
      accepted_ = rival_;
    }
  }

  // Predicted within the budget but measured over it: plan again with the excess taken off --
  // unless the module plan measured beside it fits, which is then the plan. True when that ends it.
  bool over_budget(PlanAttempt& chosen, const PolicyBench& it, bool other_fits) {
    const int64_t excess = it.measurement.baseline_bytes + it.measurement.peak_bytes - options_.memory_budget_bytes;
    chosen.outcome = fmt::format("not recommended: measured {} over the budget (predicted {} above the baseline, measured {})",
                                 format_bytes(static_cast<double>(excess)), format_bytes(static_cast<double>(chosen.predicted_peak_bytes)),
                                 format_bytes(static_cast<double>(it.measurement.peak_bytes)));
    if (other_fits) {
      out_.attempts[*rival_].outcome = "recommended: passes its checks; its measured peak is within the budget, where the "
                                       "selective plan preferred to it measured over the budget";
      accepted_ = rival_;
      rival_fits_alone_ = true;
      return true;
    }
    chosen.outcome += "; the next plan is solved for a budget that much smaller";
    // The next plan must be predicted at least that much smaller, and never this one again.
    margin_ = std::max(margin_ + std::max<int64_t>(excess, 1), budget_ - chosen.predicted_peak_bytes + 1);
    accepted_.reset();
    return false;
  }

  // The recommendation and the reason for it, or why there is none.
  void conclude() {
    if (accepted_) {
      recommend(out_.attempts[*accepted_]);
    } else if (out_.reason.empty() && margin_ > 0) {
      out_.reason = fmt::format("no plan fits in {} when measured: the plans predicted to fit measured over it, and no "
                                "smaller one is predicted to fit",
                                budget_text(options_));
    } else if (out_.reason.empty()) {
      const auto& prof = out_.profile;
      std::vector<bool> all(prof.sites.size(), false);
      for (size_t i = 0; i < prof.sites.size(); ++i) all[i] = !excluded_.count(i);
      out_.reason = fmt::format(
          "no plan fits in {}: the least memory a plan {}is predicted to take is {} ({} above the baseline)",
          budget_text(options_), excluded_.empty() ? "" : "that passes its checks ",
          format_bytes(static_cast<double>(prof.baseline_bytes + predict_peak(prof, all))),
          format_bytes(static_cast<double>(predict_peak(prof, all))));
    }
  }

  void recommend(const PlanAttempt& a) {
    out_.recommendation = a.policy;
    out_.fits = true;
    const auto n = a.sites.size();
    const char* plural = n == 1 ? "" : "s";
    if (a.sites.empty()) {
      out_.reason = fmt::format("the plain step fits in {}: nothing needs to be checkpointed", budget_text(options_));
    } else if (accepted_ == rival_) {
      out_.reason = fmt::format(
          "the module plan ({} site{}) the solver ranked after a selective plan: both pass the checks; {}", n, plural,
          rival_fits_alone_ ? fmt::format("only this one fits in {} when measured", budget_text(options_))
                            : fmt::format("both fit in {} when measured and this one is measured faster", budget_text(options_)));
    } else {
      out_.reason = fmt::format("the plan that recomputes least ({} site{}) among those predicted to fit in {}; it passes "
                                "the checks and its measured peak fits",
                                n, plural, budget_text(options_));
    }
  }
};

}  // namespace

MemoryPlan make_memory_plan(Runner& runner, const std::vector<std::string>& site_globs, const PlanOptions& options) {
  return Planner(runner, site_globs, options).plan();
}

}  // namespace ckcheck
