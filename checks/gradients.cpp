// gradients: the checkpointed step's loss, outputs, parameter and input gradients against the
// plain step's; and a warning when equality proves nothing because no gradient reached the
// checkpointed sites.
#include <algorithm>
#include <set>

#include <fmt/ranges.h>

#include "checks/common.h"
#include "checks/evidence.h"

namespace ckcheck {
namespace {

bool compared_here(const std::string& kind) {
  return kind == "loss" || kind == "output" || kind == "param-grad" || kind == "input-grad";
}

// Machine epsilon of a floating-point dtype (0 for others).
double epsilon_of(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kDouble:
      return 2.220446049250313e-16;
    case torch::kFloat:
      return 1.1920928955078125e-07;
    case torch::kHalf:
      return 9.765625e-04;
    case torch::kBFloat16:
      return 7.8125e-03;
    default:
      return 0.0;
  }
}

// How many epsilons of a gradient's largest value a different summation order may move it.
constexpr double kReassociationEps = 1024.0;

// True when checkpointing changed only the order in which gradients were summed: no site-level
// evidence, every recompute reproduced its forward bitwise, the loss and the outputs are equal,
// and every differing tensor is a gradient within kReassociationEps epsilons of its scale. The
// backward then computed the same contributions and added them in another order (a reentrant
// checkpoint runs a separate backward per checkpointed call).
bool rounding_only(const CheckContext& ctx, const std::vector<SiteExplanation>& explained) {
  if (!explained.empty()) return false;
  size_t recomputed = 0;
  for (const auto& c : ctx.records.checkpointed.calls) {
    if (!c.recomputed) continue;
    ++recomputed;
    for (const auto& d : c.output_diffs) {
      if (!d.equal) return false;
    }
  }
  if (recomputed == 0) return false;
  torch::NoGradGuard no_grad;
  for (const auto& d : ctx.diffs) {
    if (d.equal || !compared_here(d.kind)) continue;
    if ((d.kind != "param-grad" && d.kind != "input-grad") || d.missing != "none" || !d.note.empty() ||
        d.nonfinite_checkpointed + d.nonfinite_reference > 0) {
      return false;
    }
    const auto* ref = ctx.records.reference.find(d.name, d.kind, d.step);
    if (!ref || !ref->value.defined()) return false;
    const double scale = ref->value.abs().max().item<double>();
    if (!(d.max_abs <= kReassociationEps * epsilon_of(ref->value) * scale)) return false;
  }
  return true;
}

class GradientsCheck : public Check {
 public:
  std::string id() const override { return "gradients"; }
  std::string description() const override {
    return "loss, outputs, parameter and input gradients equal the plain step's (within the "
           "tolerance); warns when no gradient reaches the checkpointed sites";
  }

  CheckResult run(const CheckContext& ctx) const override {
    if (!ctx.records.reference.error.empty()) return reference_failed(id(), ctx);
    CheckResult r;
    r.id = id();
    const auto& ckpt = ctx.records.checkpointed;
    if (!ckpt.error.empty()) {
      return checkpointed_failed(id(), ctx, "the checkpointed step failed: ",
                                 "the checkpointed step failed where the plain step did not");
    }
    if (auto not_repeatable = plain_not_repeatable(id(), ctx)) return *not_repeatable;
    const auto explained = explain_sites(ctx);
    const bool rounding = rounding_only(ctx, explained);

    // One finding per (cause, site): the tensors it explains, named by the worst of them.
    struct Group {
      Finding finding;
      std::vector<std::string> tensors;
      double worst = -1;
    };
    std::vector<Group> groups;
    size_t compared = 0, differing = 0;
    for (const auto& d : ctx.diffs) {
      if (!compared_here(d.kind)) continue;
      ++compared;
      if (d.equal) continue;
      ++differing;
      Finding f;
      std::string evidence;
      if (d.missing != "none") {
        f.cause = Cause::kMissingGrad;
        f.site = owning_unit(ctx.plan, d.name);
        evidence = fmt::format("{} exists only on the {} side", d.name,
                               d.missing == "checkpointed" ? "reference" : "checkpointed");
      } else if (d.nonfinite_checkpointed > d.nonfinite_reference) {
        f.cause = Cause::kNonFinite;
        evidence = fmt::format("{} has {} NaN/Inf values with checkpointing, {} without", d.name,
                               d.nonfinite_checkpointed, d.nonfinite_reference);
      } else if (rounding) {
        f.cause = Cause::kAccumulationOrder;
        evidence = fmt::format(
            "every recompute reproduced its forward bitwise and the loss and outputs are equal; the gradient "
            "differs by {:.3g}, within {} epsilons of its largest value: the backward summed the same "
            "contributions in another order", d.max_abs, kReassociationEps);
      } else {
        f.cause = explained.empty() ? Cause::kNonDeterministic : explained.front().cause;
        f.site = explained.empty() ? "" : explained.front().site;
        evidence = explained.empty() ? "no site-level evidence explains it; run `ckcheck diagnose`"
                                     : explained.front().evidence;
      }
      auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
        return g.finding.cause == f.cause && g.finding.site == f.site;
      });
      if (it == groups.end()) {
        groups.push_back({f, {}, -1});
        it = groups.end() - 1;
      }
      it->tensors.push_back(d.name);
      const double score = d.missing != "none" ? 1e300 : d.max_rel;
      if (score > it->worst) {
        it->worst = score;
        it->finding.tensor = d.name;
        it->finding.details = {{"worst", diff_json(d)}};
        it->finding.message = fmt::format(
            "{} {} differs at step {}: {} of {} elements, max abs {:.3g}, max rel {:.3g}{}{}; {}",
            d.kind, d.name, d.step, d.mismatched, d.numel, d.max_abs, d.max_rel,
            d.note.empty() ? "" : ", ", d.note, evidence);
      }
    }
    for (auto& g : groups) {
      g.finding.details["tensors"] = g.tensors;
      if (g.finding.cause == Cause::kMissingGrad) {
        // Name every tensor without its gradient: they are what the user must fix.
        constexpr size_t kNamed = 8;
        std::vector<std::string> named(g.tensors.begin(), g.tensors.begin() + std::min(kNamed, g.tensors.size()));
        g.finding.message = fmt::format(
            "{} on one side only (with checkpointing or without, not both): {}{}", count_of(g.tensors.size(), "gradient"),
            fmt::join(named, ", "), g.tensors.size() > kNamed ? fmt::format(" and {} more", g.tensors.size() - kNamed) : "");
      } else if (g.tensors.size() > 1) {
        g.finding.message = fmt::format("{} tensors differ; the worst, {}", g.tensors.size(), g.finding.message);
      }
      add_finding(r, g.finding);
    }
    r.details["compared"] = compared;
    r.details["differing"] = differing;
    if (differing > 0) {
      // Rounding from another summation order is not a wrong gradient: a warning that says so.
      r.status = rounding ? Status::kWarn : Status::kFail;
      r.summary = fmt::format("{} of {} tensors differ ({}){}", differing, compared, ctx.tolerance.text(),
                              rounding ? " by rounding only: gradients summed in another order" : "");
      return r;
    }
    r.summary = fmt::format("{} tensors equal ({}) with {} checkpointed", compared,
                            ctx.tolerance.text(), count_of(ctx.plan.units.size(), "unit"));

    // Vacuity: equal gradients say nothing when no parameter has one ...
    size_t params = 0, with_grad = 0;
    for (const auto& t : ctx.records.reference.tensors) {
      if (t.kind != "param-grad") continue;
      ++params;
      with_grad += t.value.defined();
    }
    if (params > 0 && with_grad == 0) {
      r.status = Status::kWarn;
      add_finding(r, {Cause::kVacuous, "", "", fmt::format("none of the {} parameters gets a gradient (do they require grad?), so there are no parameter gradients to compare", params), ""});
      r.summary += "; but no parameter has a gradient";
    }
    // ... or about sites no gradient reached.
    if (ctx.plan.units.empty()) {
      r.status = Status::kWarn;
      add_finding(r, {Cause::kVacuous, "", "", "the policy checkpoints nothing, so the run compares the plain step with itself", ""});
      return r;
    }
    std::vector<std::string> unexercised;
    for (const auto& unit : ctx.plan.units) {
      const auto site = Plan::unit_label(unit);
      bool exercised = false;
      for (const auto& c : ckpt.calls) exercised = exercised || (c.site == site && c.recomputed && !c.grad_all_zero);
      if (!exercised) unexercised.push_back(site);
    }
    if (!unexercised.empty()) {
      r.status = Status::kWarn;
      for (const auto& site : unexercised) {
        add_finding(r, {Cause::kVacuous, site, "",
                        "no non-zero gradient reached this checkpointed site, so the equal "
                        "gradients do not show that its recompute is correct", ""});
      }
      r.summary += fmt::format("; but {} of {} checkpointed units got only zero gradients",
                               unexercised.size(), ctx.plan.units.size());
    }
    return r;
  }
};

}  // namespace

std::unique_ptr<Check> make_gradients_check() { return std::make_unique<GradientsCheck>(); }

}  // namespace ckcheck
