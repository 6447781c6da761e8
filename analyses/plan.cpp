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

// Bytes the checkpointed sites among the first `k` free: prefix[k].
std::vector<int64_t> freed_prefix(const StepProfile& p, const std::vector<bool>& s) {
  std::vector<int64_t> prefix(p.sites.size() + 1, 0);
  for (size_t j = 0; j < p.sites.size(); ++j) prefix[j + 1] = prefix[j] + (s[j] ? p.sites[j].kept_bytes : 0);
  return prefix;
}

int64_t region_peak(const StepProfile& p, const PeakRegion& r, int64_t freed, bool recomputed) {
  return r.peak_bytes - freed + (recomputed ? p.sites[*r.recomputes].recompute_extra_bytes : 0);
}

// Sites alike in memory (the same input, output, activations kept and forward peak: repeated
// blocks) cost the same: the median of their recompute times. Which of identical blocks a plan takes is
// then decided by memory, never by the clock's noise.
std::vector<double> grouped_costs(const StepProfile& p) {
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::vector<size_t>> groups;
  for (size_t i = 0; i < p.sites.size(); ++i) {
    const auto& c = p.sites[i];
    groups[{c.input_bytes, c.output_bytes, c.kept_bytes, c.forward_peak_bytes}].push_back(i);
  }
  std::vector<double> cost(p.sites.size(), 0.0);
  for (const auto& [key, members] : groups) {
    std::vector<double> times;
    for (size_t i : members) times.push_back(p.sites[i].recompute_seconds);
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

int64_t predict_peak(const StepProfile& p, const std::vector<bool>& s, std::string* where) {
  const auto prefix = freed_prefix(p, s);
  int64_t peak = 0;
  for (const auto& r : p.regions) {
    const bool recomputed = r.recomputes && s[*r.recomputes];
    const int64_t v = region_peak(p, r, prefix[std::min(r.holding, p.sites.size())], recomputed);
    if (v > peak || (where && where->empty())) {
      peak = std::max(peak, v);
      if (where) *where = r.where;
    }
  }
  return peak;
}

double predict_seconds(const StepProfile& p, const std::vector<bool>& s) {
  double t = p.step_seconds;
  for (size_t i = 0; i < p.sites.size(); ++i) t += s[i] ? p.sites[i].recompute_seconds : 0.0;
  return t;
}

std::optional<std::vector<bool>> solve_plan(const StepProfile& p, int64_t budget, const std::set<size_t>& excluded,
                                            SolverStats* stats) {
  const size_t n = p.sites.size();
  const auto cost = grouped_costs(p);
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
        if (take && (excluded.count(k) || p.sites[k].kept_bytes <= 0)) continue;
        State t = s;
        if (!check(t, k, take)) continue;  // site k's backward, recomputing it when taken
        if (take) {
          t.freed += p.sites[k].kept_bytes;
          t.cost += cost[k];
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
  const auto best = std::min_element(front.begin(), front.end(), [&](const State& a, const State& b) {
    if (!same_cost(a.cost, b.cost)) return a.cost < b.cost;
    const auto na = std::count(a.taken.begin(), a.taken.end(), true), nb = std::count(b.taken.begin(), b.taken.end(), true);
    if (na != nb) return na < nb;
    return predict_peak(p, a.taken) < predict_peak(p, b.taken);
  });
  return best->taken;
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

MemoryPlan make_memory_plan(Runner& runner, const std::vector<std::string>& site_globs, const PlanOptions& options) {
  auto& model = runner.model();
  MemoryPlan out;
  out.memory_budget_bytes = options.memory_budget_bytes;
  out.solver =
      "exact dynamic program over the sites in forward order, keeping per prefix the (bytes freed, time added) pairs "
      "no other beats on both: O(n*F) for n sites and a front of F pairs";
  const auto candidates = Plan::make(model, site_globs, Policy::parse("every:1")).candidates;
  out.profile = profile_sites(runner, candidates, options.profile_warmup, options.profile_steps);
  if (!out.profile.error.empty()) {
    throw UsageError("the model's plain training step fails, so it cannot be profiled: " + out.profile.error);
  }
  const auto& prof = out.profile;
  const int64_t budget = options.memory_budget_bytes - prof.baseline_bytes;
  if (budget < 0) {
    out.reason = fmt::format("no plan fits in {}: parameters, gradients and inputs alone take {}",
                             format_bytes(static_cast<double>(options.memory_budget_bytes)),
                             format_bytes(static_cast<double>(prof.baseline_bytes)));
    return out;
  }
  std::set<size_t> excluded;
  std::map<std::string, std::pair<std::string, std::vector<std::string>>> known;
  int64_t margin = 0;  // taken off the budget after a plan measured over it
  std::optional<size_t> accepted;
  for (int64_t round = 0; round < 3; ++round) {
    // Solve and check until a plan passes its checks.
    accepted.reset();
    while (static_cast<int64_t>(out.attempts.size()) < options.max_attempts) {
      SolverStats stats;
      const auto s = solve_plan(prof, budget - margin, excluded, &stats);
      out.stats.states += stats.states;
      out.stats.largest_front = std::max(out.stats.largest_front, stats.largest_front);
      if (!s) break;
      PlanAttempt a;
      a.policy = plan_policy(prof, *s);
      for (size_t i = 0; i < s->size(); ++i) {
        if ((*s)[i]) a.sites.push_back(prof.sites[i].site);
      }
      a.predicted_peak_bytes = predict_peak(prof, *s, &a.peak_where);
      a.predicted_seconds = predict_seconds(prof, *s);
      const bool repeated = std::any_of(out.attempts.begin(), out.attempts.end(), [&](const PlanAttempt& b) { return b.policy == a.policy; });
      if (repeated) break;
      if (!a.sites.empty()) {
        const auto plan = Plan::make(model, site_globs, Policy::parse(a.policy));
        const auto outcome = run_checks(runner, plan, options.bench.tolerance, select_checks({}));
        a.checks = verdict_name(verdict_of(outcome.results));
        a.check_failures = check_failures(outcome.results);
        // The sites the failing checks name.
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
        known[Policy::parse(a.policy).text()] = {a.checks, a.check_failures};
        if (a.checks == "error" && named.empty()) {
          // The checks cannot judge this model's checkpointed step, and no site is to blame (its
          // plain step does not repeat, say): no other plan would be judged either.
          a.outcome = fmt::format("not recommended: the checks cannot judge it ({}); no plan is verified",
                                  fmt::join(a.check_failures, "; "));
          out.attempts.push_back(a);
          out.reason = "no plan can be verified: the checks cannot judge this model's checkpointed step (" +
                       fmt::format("{}", fmt::join(a.check_failures, "; ")) + ")";
          break;
        }
        if (a.checks != "pass") {
          // The sites the findings name; where they name none, every site of the plan.
          a.set_aside = named.empty() ? a.sites : std::vector<std::string>(named.begin(), named.end());
          for (size_t i = 0; i < prof.sites.size(); ++i) {
            if (std::count(a.set_aside.begin(), a.set_aside.end(), prof.sites[i].site)) excluded.insert(i);
          }
          a.outcome = fmt::format("not recommended: {} its checks ({}); the next plan leaves {} alone",
                                  a.checks == "fail" ? "fails" : "cannot pass", fmt::join(a.check_failures, "; "),
                                  fmt::join(a.set_aside, ", "));
          out.attempts.push_back(a);
          continue;
        }
      }
      out.attempts.push_back(a);
      accepted = out.attempts.size() - 1;
      break;
    }
    if (!accepted) break;
    // Measure every plan proposed so far against none, interleaved; each with its checks' verdict.
    auto bench = options.bench;
    bench.policies = {"none"};
    for (const auto& a : out.attempts) {
      if (std::find(bench.policies.begin(), bench.policies.end(), a.policy) == bench.policies.end()) bench.policies.push_back(a.policy);
    }
    bench.memory_budget_bytes = options.memory_budget_bytes;
    bench.known_checks = known;
    out.measured = run_bench(runner, site_globs, bench);
    auto& chosen = out.attempts[*accepted];
    const auto* it = measured_plan(out, chosen.policy);
    if (!it) {
      std::string why;
      for (const auto& b : out.measured.policies) {
        if (b.policy == Policy::parse(chosen.policy).text()) why = ": " + b.note + b.measurement.error;
      }
      chosen.outcome = "not recommended: its step could not be measured" + why;
      accepted.reset();
      break;
    }
    const int64_t total = it->measurement.baseline_bytes + it->measurement.peak_bytes;
    if (total <= options.memory_budget_bytes && it->fits) {
      chosen.outcome = chosen.sites.empty() ? "recommended: nothing to check; the plain step's measured peak is within the budget"
                                            : "recommended: passes its checks; its measured peak is within the budget";
      break;
    }
    // Predicted within the budget but measured over it: plan again with the excess taken off.
    const int64_t excess = total - options.memory_budget_bytes;
    chosen.outcome = fmt::format("not recommended: measured {} over the budget (predicted {} above the baseline, measured {}); "
                                 "the next plan is solved for a budget that much smaller",
                                 format_bytes(static_cast<double>(excess)), format_bytes(static_cast<double>(chosen.predicted_peak_bytes)),
                                 format_bytes(static_cast<double>(it->measurement.peak_bytes)));
    // The next plan must be predicted at least that much smaller, and never this one again.
    margin = std::max(margin + std::max<int64_t>(excess, 1), budget - chosen.predicted_peak_bytes + 1);
    accepted.reset();
  }
  if (accepted) {
    const auto& a = out.attempts[*accepted];
    out.recommendation = a.policy;
    out.fits = true;
    out.reason = a.sites.empty()
                     ? fmt::format("the plain step fits in {}: nothing needs to be checkpointed",
                                   format_bytes(static_cast<double>(options.memory_budget_bytes)))
                     : fmt::format("the plan that recomputes least ({} site{}) among those predicted to fit in {}; it passes "
                                   "the checks and its measured peak fits",
                                   a.sites.size(), a.sites.size() == 1 ? "" : "s",
                                   format_bytes(static_cast<double>(options.memory_budget_bytes)));
  } else if (out.reason.empty() && margin > 0) {
    out.reason = fmt::format("no plan fits in {} when measured: the plans predicted to fit measured over it, and no smaller "
                             "one is predicted to fit",
                             format_bytes(static_cast<double>(options.memory_budget_bytes)));
  } else if (out.reason.empty()) {
    std::vector<bool> all(prof.sites.size(), false);
    for (size_t i = 0; i < prof.sites.size(); ++i) all[i] = !excluded.count(i);
    out.reason = fmt::format("no plan fits in {}: the least memory a plan {}is predicted to take is {} ({} above the baseline)",
                             format_bytes(static_cast<double>(options.memory_budget_bytes)),
                             excluded.empty() ? "" : "that passes its checks ",
                             format_bytes(static_cast<double>(prof.baseline_bytes + predict_peak(prof, all))),
                             format_bytes(static_cast<double>(predict_peak(prof, all))));
  }
  out.measured.recommendation = out.recommendation;
  out.measured.reason = out.reason;
  return out;
}

}  // namespace ckcheck
