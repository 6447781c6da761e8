// determinism: each checkpointed site, run twice on identical inputs and RNG state, gives the same
// outputs. If not: non-deterministic (differs even from identical state), or stateful (differs
// because the first call changed the site's own state).
#include <fmt/ranges.h>

#include "checks/common.h"
#include "checks/evidence.h"
#include "harness/support/text.h"

namespace ckcheck {
namespace {

// The site differs from itself even from identical state; `within` when inside the tolerance.
Finding non_deterministic_finding(const CheckContext& ctx, const UnitProbe& p, bool& within) {
  Finding f;
  f.site = p.site;
  f.cause = Cause::kNonDeterministic;
  within = !p.first_outputs.empty();
  double worst_rel = 0.0;
  for (size_t i = 0; i < p.first_outputs.size() && i < p.other_outputs.size(); ++i) {
    auto d = compare_tensors(p.first_outputs[i], p.other_outputs[i], ctx.tolerance);
    within = within && d.equal;
    worst_rel = std::max(worst_rel, d.max_rel);
  }
  f.tensor = "outputs";
  f.details = {{"max_abs_diff", p.max_abs_diff}, {"max_rel_diff", worst_rel},
               {"within_tolerance", within}, {"tolerance", ctx.tolerance.text()}};
  f.message = fmt::format(
      "the site gives different outputs on identical inputs and RNG state (max abs "
      "difference {:.3g}){}",
      p.max_abs_diff,
      within ? fmt::format(", within the tolerance {}", ctx.tolerance.text())
             : "; the recompute cannot reproduce the forward");
  return f;
}

// The site repeats itself from a restart but not from the state its first call left.
Finding stateful_finding(const UnitProbe& p) {
  Finding f;
  f.site = p.site;
  f.cause = Cause::kStateful;
  std::vector<std::string> named;
  for (const auto& s : p.changed_state) named.push_back(state_display_name(s));
  named.insert(named.end(), p.host_generators.begin(), p.host_generators.end());
  f.tensor = named.empty() ? "" : named.front();
  f.details = {{"changed_state", named}};
  f.message = named.empty()
                  ? "the site changes state kept outside the model (a list, dict or cache object it is handed, a "
                    "global, a closure's cache, a generator of its own), so a second call computes something else"
                  : fmt::format("the site changes its own state ({}) on every call, so the "
                                "recompute computes something else than the forward",
                                fmt::join(named, ", "));
  if (const auto handed = handed_state_change(p); !handed.empty()) {
    f.tensor = p.handed_state.front();
    f.details["handed_state"] = p.handed_state;
    f.message = handed;
    f.hint = kHandedStateHint;
  }
  if (!p.repeat_error.empty()) {
    f.details["repeat_error"] = first_line(p.repeat_error);
    f.message += fmt::format(" (a second call throws: {})", first_line(p.repeat_error));
  }
  return f;
}

class DeterminismCheck : public DeclaredCheck {
 public:
  DeterminismCheck()
      : DeclaredCheck(CheckInfo{"determinism", CheckKind::kHazard, 60,
          "each checkpointed site gives the same outputs when run again on identical inputs and "
          "RNG state (non-deterministic ops, stateful modules)"}
          .needing(&Needs::probe)) {}

  CheckResult run(const CheckContext& ctx) const override {
    auto r = result();
    if (auto compiled = skipped_when_compiled(id(), ctx)) return *compiled;
    if (!ctx.records.probes) {
      return skipped(id(), "the determinism probe did not run");
    }
    const auto tally = judge_probes(ctx, r);
    // A unit that computes something else in its recompute fails the check when the step shows it;
    // when every tensor of the checkpointed step still equals the plain step's, the recompute's
    // difference reached nothing (no saved tensor, no gradient, no state) and it warns.
    if (tally.failed) r.status = checkpointed_step_unchanged(ctx) ? Status::kWarn : Status::kFail;
    if (r.findings.empty() && !tally.probe_error.empty()) {
      return skipped(id(), "the probe could not run the checkpointed units again (" + tally.probe_error + ")");
    }
    const size_t reproduced = ctx.records.reproduced_units.size();
    if (tally.probed == 0 && reproduced == 0 && tally.host_drawn == 0 && !ctx.plan.units.empty()) {
      // Units the probe cannot call on their own (closures a model hands to its own checkpoint)
      // are not evidence of determinism.
      return skipped(id(), fmt::format("the probe could not run any of the {} again on its own",
                                       count_of(ctx.plan.units.size(), "checkpointed unit")));
    }
    if (r.findings.empty()) {
      r.summary = repeat_summary(tally, reproduced);
    } else {
      r.summary = fmt::format("{} not repeat identically", count_of(r.findings.size(), "unit") + (r.findings.size() == 1 ? " does" : " do"));
      if (tally.failed && r.status == Status::kWarn) r.summary += "; the checkpointed step still equals the plain one";
    }
    return r;
  }

 private:
  struct Tally {
    bool failed = false;
    size_t probed = 0;
    size_t host_drawn = 0;    // units left to the rng check: they draw from generators outside torch
    std::string probe_error;  // a probe that could not run is no evidence of non-determinism
  };

  // Each probed unit that did not repeat: a finding (non-deterministic, or stateful), unless the
  // rng check explains it.
  static Tally judge_probes(const CheckContext& ctx, CheckResult& r) {
    Tally tally;
    for (const auto& p : *ctx.records.probes) {
      ++tally.probed;
      if (!p.error.empty()) {
        if (tally.probe_error.empty()) tally.probe_error = fmt::format("{}: {}", p.site, first_line(p.error));
        continue;
      }
      // Private generators are the rng check's to report: the repeat draws other numbers.
      if (p.repeat_equal || p.private_generator) continue;
      // So are generators outside torch (Python's, NumPy's), when they alone explain the repeat.
      if (!host_generator_draws(&p).empty()) {
        --tally.probed;
        ++tally.host_drawn;
        continue;
      }
      if (!p.restart_equal) {
        bool within = false;
        add_finding(r, non_deterministic_finding(ctx, p, within));
        if (!within) tally.failed = true;
        if (within && r.status == Status::kPass) r.status = Status::kWarn;
      } else {
        add_finding(r, stateful_finding(p));
        tally.failed = true;
      }
    }
    return tally;
  }

  // Every unit repeated: how many were probed, reproduced in the recompute, or left to rng.
  static std::string repeat_summary(const Tally& tally, size_t reproduced) {
    // A unit whose recompute reproduced its forward bitwise was run twice on identical inputs
    // already: the probe runs only where a recompute differed (--probe-every-unit: everywhere).
    const std::string again = count_of(reproduced, "checkpointed unit") +
                              (reproduced == 1 ? " reproduces its forward" : " reproduce their forwards") +
                              " bitwise in the recompute";
    const size_t probed = tally.probed;
    if (tally.host_drawn > 0) {
      std::string s = fmt::format("{} from generators outside torch (the rng check's to report)",
                                  count_of(tally.host_drawn, "checkpointed unit") + (tally.host_drawn == 1 ? " draws" : " draw"));
      if (probed > 0) s += fmt::format("; {} probed repeat identically", count_of(probed, "other unit"));
      if (reproduced > 0) s += "; " + again;
      return s;
    }
    if (probed == 0 && reproduced == 0) return "nothing is checkpointed";
    if (reproduced == 0) return fmt::format("{} repeat identically", count_of(probed, "checkpointed unit"));
    if (probed == 0) return again;
    return fmt::format("{}; {} probed repeat identically", again, count_of(probed, "other unit"));
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(DeterminismCheck);

}  // namespace ckcheck
