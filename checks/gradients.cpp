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

constexpr CauseWord kOutputStructureWord{
    "output-structure",
    "the checkpointed step returns something else than the plain one (Hugging Face models turn use_cache off "
    "while gradient checkpointing trains, and return no cache): do not read those outputs in training, or pass "
    "use_cache=False yourself so that both steps return the same"};
const Cause kOutputStructure{kOutputStructureWord};

constexpr CauseWord kNotAppliedWord{
    "not-applied",
    "checkpointing is asked for here but recomputes nothing, so it keeps every activation and frees no memory: an "
    "op-level policy must leave ops to the recompute (PREFER_RECOMPUTE for the cheap ones, MUST_SAVE only for "
    "matmuls and attention), and a switch must reach the layers that run (enable it after wrapping the model, on "
    "the module the trainer calls)"};
const Cause kNotApplied{kNotAppliedWord};

// The checkpointed step's output has another structure than the plain one's (a cache or key the
// checkpoint drops): never silent. Outputs present on one side only are part of it.
bool structure_differs(const CheckContext& ctx) {
  const auto& a = ctx.records.reference.output_structure;
  const auto& b = ctx.records.checkpointed.output_structure;
  return !a.empty() && !b.empty() && a != b;
}

Finding structure_finding(const CheckContext& ctx) {
  Finding f;
  f.cause = kOutputStructure;
  f.tensor = "output";
  f.message = fmt::format("the checkpointed step returned {} where the plain step returned {}",
                          ctx.records.checkpointed.output_structure, ctx.records.reference.output_structure);
  f.details = {{"plain", ctx.records.reference.output_structure},
               {"checkpointed", ctx.records.checkpointed.output_structure}};
  return f;
}

bool compared_here(const std::string& kind) {
  return kind == "loss" || kind == "output" || kind == "param-grad" || kind == "input-grad";
}

// One finding per (cause, site): the tensors it explains, named by the worst of them.
struct Group {
  Finding finding;
  std::vector<std::string> tensors;
  double worst = -1;
};

// What the records say about the step as a whole, read once for all differing tensors.
struct StepEvidence {
  std::vector<SiteExplanation> explained;  // sites whose recompute differs, and why
  RoundingEvidence rounding;               // whether the differences are rounding only, and why
  bool faithful = false;                   // calls were recomputed, each reproducing its forward bitwise
  std::vector<std::string> offload_changed;  // --offload: tensors the offload's hooks change in the plain step
};

// --tolerance auto: what the plain step's reruns measured, for the report.
nlohmann::json noise_json(const NoiseEnvelope& noise) {
  size_t varying = 0;
  double largest = 0.0;
  std::string noisiest;
  for (const auto& e : noise.entries) {
    if (e.max_abs <= 0.0) continue;
    ++varying;
    const double rel = e.scale > 0 ? e.max_abs / e.scale : 0.0;
    if (rel > largest) largest = rel, noisiest = e.name;
  }
  return {{"plain_reruns", noise.reruns}, {"threads", noise.threads}, {"varying", varying},
          {"largest_relative", largest}, {"noisiest", noisiest}, {"within_noise", noise.within},
          {"factor", NoiseEnvelope::kFactor}};
}

// The tolerance as the summary says it: under auto, with the noise it was judged against.
std::string tolerance_words(const CheckContext& ctx) {
  const auto& noise = ctx.records.noise;
  if (!ctx.tolerance.automatic() || !noise) return ctx.tolerance.text();
  size_t varying = 0;
  for (const auto& e : noise->entries) varying += e.max_abs > 0.0;
  return fmt::format("auto: {} of the plain step's tensors vary over {} reruns, {} within {:g} times that noise",
                     varying, noise->reruns, noise->within.size(), NoiseEnvelope::kFactor);
}

// Why a differing tensor is no rounding, as measured ("" where nothing was measured).
std::string not_rounding(const CheckContext& ctx, const TensorDiff& d) {
  const auto t = tensor_rounding(ctx, d);
  if (t.rounding || t.rule == "none") return "";
  if (t.rule == "float64") {
    return fmt::format("; rerun in float64 it still differs by {:.3g}, where rounding shrinks below {:.3g}: not rounding",
                       t.float64, t.bound);
  }
  return fmt::format("; {:.3g} times the reordering error a sum of its own size allows: not rounding",
                     t.bound > 0 ? d.max_abs / t.bound : 0.0);
}

// No hazard explains a differing tensor: say so, rather than guess one (the determinism probe did
// not fail).
Finding unexplained(const CheckContext& ctx, const TensorDiff& d, const StepEvidence& step, std::string& evidence) {
  Finding f;
  f.cause = Cause::kUnexplained;
  f.site = owning_unit(ctx.plan, d.name);
  evidence = ctx.records.compiled
                 ? "the compiled graphs show no random op recomputed with new numbers; run `ckcheck diagnose "
                   "--compile` to find the block"
             : step.faithful ? "every recompute reproduced its forward bitwise, so something outside the recomputed "
                             "ops changed it (a hook, or code that assigns or frees .grad); run `ckcheck diagnose`"
                           : "no site-level evidence explains it; run `ckcheck diagnose`";
  evidence += not_rounding(ctx, d);
  return f;
}

// Compiled, each unit's explanation is its own graph's (a block recomputing its own random ops): a
// tensor of a unit that has one is that unit's; otherwise, and eagerly, the first.
Finding explained_by(const CheckContext& ctx, const TensorDiff& d, const std::vector<SiteExplanation>& explained,
                     std::string& evidence) {
  const SiteExplanation* e = &explained.front();
  if (ctx.records.compiled) {
    const auto unit = owning_unit(ctx.plan, d.name);
    for (const auto& x : explained) {
      if (x.site == unit) e = &x;
    }
  }
  Finding f;
  f.cause = e->cause;
  f.site = e->site;
  f.hint = e->hint;
  evidence = e->evidence;
  return f;
}

// Under --poison, NaN the checkpointed step computed from the state it overwrote: the explained
// site that read it names the cause, not the NaN.
bool poison_read(const CheckContext& ctx, const std::vector<SiteExplanation>& explained) {
  if (!ctx.config.poison_rewritten || explained.empty()) return false;
  const auto& calls = ctx.records.checkpointed.calls;
  return std::any_of(calls.begin(), calls.end(), [](const CallEvidence& c) { return !c.state_poisoned.empty(); });
}

// The cause and site of one differing tensor, and the evidence for it, in words.
Finding cause_of(const CheckContext& ctx, const TensorDiff& d, const StepEvidence& step, std::string& evidence) {
  const auto& explained = step.explained;
  Finding f;
  if (d.missing != "none") {
    f.cause = Cause::kMissingGrad;
    f.site = owning_unit(ctx.plan, d.name);
    evidence = fmt::format("{} exists only on the {} side", d.name, d.missing == "checkpointed" ? "reference" : "checkpointed");
  } else if (d.nonfinite_checkpointed > d.nonfinite_reference && !poison_read(ctx, explained)) {
    f.cause = Cause::kNonFinite;
    evidence = fmt::format("{} has {} NaN/Inf values with checkpointing, {} without", d.name,
                           d.nonfinite_checkpointed, d.nonfinite_reference);
  } else if (std::find(step.offload_changed.begin(), step.offload_changed.end(), d.name) != step.offload_changed.end()) {
    f.cause = kOffload;
    evidence = fmt::format("offloaded, the plain step's {} differs from the plain step's too: the offload's hooks "
                           "changed it, checkpoints aside (see the offload check)", d.name);
  } else if (step.rounding.rounding && !explained.empty()) {
    // Rounding by other kernels for the same math (grad-mode): the mechanism, as a warning.
    f.cause = explained.front().cause;
    f.site = explained.front().site;
    evidence = explained.front().evidence + "; " + step.rounding.sentence;
  } else if (step.rounding.rounding) {
    f.cause = Cause::kAccumulationOrder;
    evidence = ctx.records.compiled ? step.rounding.sentence + " (the compiled checkpointed step computes the same "
                                                                "math in other kernels)"
                                    : step.rounding.sentence;
  } else if (const auto lost = explained.empty() ? graph_lost_in_no_grad_forward(ctx, d.name) : std::nullopt) {
    f.cause = lost->cause;
    f.site = lost->site;
    evidence = lost->evidence + not_rounding(ctx, d);
  } else if (const auto kept = explained.empty() && step.faithful ? kept_from_no_grad_forward(ctx, d.name) : std::nullopt) {
    f.cause = kept->cause;
    f.site = kept->site;
    evidence = kept->evidence + not_rounding(ctx, d);
  } else if (explained.empty()) {
    f = unexplained(ctx, d, step, evidence);
  } else {
    f = explained_by(ctx, d, explained, evidence);
  }
  return f;
}

// Adds a differing tensor to the group of its (cause, site); the worst tensor names the group.
void add_to_group(std::vector<Group>& groups, const Finding& f, const TensorDiff& d, const std::string& evidence) {
  auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
    return g.finding.cause == f.cause && g.finding.site == f.site;
  });
  if (it == groups.end()) {
    groups.push_back({f, {}, -1});
    it = groups.end() - 1;
  }
  it->tensors.push_back(d.name);
  const double score = d.missing != "none" ? 1e300 : d.max_rel;
  if (score <= it->worst) return;
  it->worst = score;
  it->finding.tensor = d.name;
  it->finding.details = {{"worst", diff_json(d)}};
  it->finding.message =
      fmt::format("{} {} differs at step {}: {} of {} elements, max abs {:.3g}, max rel {:.3g}{}{}; {}", d.kind,
                  d.name, d.step, d.mismatched, d.numel, d.max_abs, d.max_rel, d.note.empty() ? "" : ", ", d.note,
                  evidence);
}

// A group's finding: every tensor without its gradient named (they are what the user must fix),
// or the count of tensors beside the worst one.
Finding group_finding(Group g) {
  g.finding.details["tensors"] = g.tensors;
  if (g.finding.cause == Cause::kMissingGrad) {
    constexpr size_t kNamed = 8;
    std::vector<std::string> named(g.tensors.begin(), g.tensors.begin() + std::min(kNamed, g.tensors.size()));
    g.finding.message = fmt::format(
        "{} on one side only (with checkpointing or without, not both): {}{}", count_of(g.tensors.size(), "gradient"),
        fmt::join(named, ", "), g.tensors.size() > kNamed ? fmt::format(" and {} more", g.tensors.size() - kNamed) : "");
  } else if (g.tensors.size() > 1) {
    g.finding.message = fmt::format("{} tensors differ; the worst, {}", g.tensors.size(), g.finding.message);
  }
  return g.finding;
}

// An op-level policy that saved every op of a site recomputes nothing there: the checkpoint keeps
// all of the site's activations, and the equal gradients exercised no recompute.
void warn_when_policy_keeps_everything(const CheckContext& ctx, CheckResult& r) {
  size_t sites = 0;
  for (const auto& t : ctx.model.op_policy()) {
    if (t.recomputed > 0 || t.saved == 0) continue;
    ++sites;
    Finding f{kNotApplied, t.site, "",
              fmt::format("the op-level policy saves all {} of the site and leaves none to the recompute: the "
                          "checkpoint keeps every activation here, and the equal gradients exercised no recompute",
                          count_of(static_cast<size_t>(t.saved), "op")),
              ""};
    f.details = {{"ops_saved", t.saved}, {"ops_recomputed", t.recomputed}};
    add_finding(r, std::move(f));
  }
  if (sites == 0) return;
  r.status = Status::kWarn;
  r.summary += fmt::format("; but the op-level policy recomputes nothing at {}", count_of(sites, "site"));
}

// Equal gradients say nothing when no parameter has one, when nothing is checkpointed, or about
// sites no gradient reached: a warning for each.
void warn_when_vacuous(const CheckContext& ctx, CheckResult& r) {
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
  if (ctx.plan.units.empty()) {
    r.status = Status::kWarn;
    add_finding(r, {Cause::kVacuous, "", "", "the policy checkpoints nothing, so the run compares the plain step with itself", ""});
    return;
  }
  warn_when_policy_keeps_everything(ctx, r);
  if (ctx.records.compiled) return;  // no call reaches the runner from inside a compiled graph
  std::vector<std::string> unexercised;
  for (const auto& unit : ctx.plan.units) {
    const auto site = Plan::unit_label(unit);
    bool exercised = false;
    for (const auto& c : ctx.records.checkpointed.calls) exercised = exercised || (c.site == site && c.recomputed && !c.grad_all_zero);
    if (!exercised) unexercised.push_back(site);
  }
  if (unexercised.empty()) return;
  r.status = Status::kWarn;
  for (const auto& site : unexercised) {
    add_finding(r, {Cause::kVacuous, site, "",
                    "no non-zero gradient reached this checkpointed site, so the equal "
                    "gradients do not show that its recompute is correct", ""});
  }
  r.summary += fmt::format("; but {} of {} checkpointed units got only zero gradients", unexercised.size(),
                           ctx.plan.units.size());
}

class GradientsCheck : public DeclaredCheck {
 public:
  GradientsCheck()
      : DeclaredCheck(CheckInfo{"gradients", CheckKind::kSymptom, 10,
          "loss, outputs, parameter and input gradients equal the plain step's (within the tolerance); warns "
          "when no gradient reaches the checkpointed sites, an op-level policy recomputes nothing there, or the "
          "checkpointed step returns another output structure"}
          .with_causes({kOutputStructure, kNotApplied})) {}

  CheckResult run(const CheckContext& ctx) const override {
    if (!ctx.records.reference.error.empty()) return reference_failed(id(), ctx);
    if (!ctx.records.checkpointed.error.empty()) {
      return checkpointed_failed(id(), ctx, "the checkpointed step failed: ",
                                 "the checkpointed step failed where the plain step did not");
    }
    if (auto not_repeatable = plain_not_repeatable(id(), ctx)) return *not_repeatable;
    const StepEvidence step = step_evidence(ctx);
    std::vector<Group> groups;
    size_t compared = 0, differing = 0;
    const bool restructured = structure_differs(ctx);
    for (const auto& d : ctx.diffs) {
      if (!compared_here(d.kind)) continue;
      // The structure finding says it: outputs on one side only, and the loss, which sums every output
      // (those both sides have are compared one by one).
      if (restructured && ((d.kind == "output" && d.missing != "none") || d.kind == "loss")) continue;
      ++compared;
      if (d.equal) continue;
      ++differing;
      std::string evidence;
      const auto f = cause_of(ctx, d, step, evidence);
      add_to_group(groups, f, d, evidence);
    }
    auto r = result();
    for (auto& g : groups) add_finding(r, group_finding(std::move(g)));
    if (restructured) add_finding(r, structure_finding(ctx));
    r.details["compared"] = compared;
    r.details["differing"] = differing;
    if (const auto& noise = ctx.records.noise) r.details["noise"] = noise_json(*noise);
    if (differing > 0) {
      differ(ctx, step, r, differing, compared);
      return r;
    }
    r.summary = fmt::format("{} tensors equal ({}) with {} checkpointed", compared, tolerance_words(ctx),
                            count_of(ctx.plan.units.size(), "unit"));
    if (restructured) {
      r.status = Status::kWarn;
      r.summary += "; but the checkpointed step returns another output structure";
    }
    warn_when_vacuous(ctx, r);
    return r;
  }

 private:
  // What the step's calls say: why sites differ, whether a difference is rounding, whether every
  // recompute reproduced its forward.
  static StepEvidence step_evidence(const CheckContext& ctx) {
    StepEvidence step;
    step.explained = explain_sites(ctx);
    step.rounding = rounding_evidence(ctx, step.explained);
    // A lost contribution is looked for before rounding is concluded.
    if (graph_lost_in_no_grad_forward(ctx, "")) step.rounding.rounding = false;
    bool recomputed = false, all_equal = true;  // a call whose outputs were not compared vouches for nothing
    for (const auto& c : ctx.records.checkpointed.calls) {
      if (!c.recomputed) continue;
      recomputed = true;
      all_equal = all_equal && !c.output_diffs.empty() && !recompute_differs(c);
    }
    step.faithful = recomputed && all_equal;
    if (const auto offload = ctx.model.offload_facts()) step.offload_changed = offload->differs;
    return step;
  }

  // Tensors differ: a failure, or -- rounding from another summation order is not a wrong gradient --
  // a warning that says so, with its evidence.
  static void differ(const CheckContext& ctx, const StepEvidence& step, CheckResult& r, size_t differing, size_t compared) {
    r.status = step.rounding.rounding ? Status::kWarn : Status::kFail;
    r.summary = fmt::format("{} of {} tensors differ ({}){}", differing, compared, tolerance_words(ctx),
                            !step.rounding.rounding  ? ""
                            : step.explained.empty() ? " by rounding only: gradients summed in another order"
                                                     : " by rounding only: the same math in other kernels");
    if (!step.rounding.sentence.empty()) {
      r.details["rounding"] = step.rounding.details;
      r.details["rounding"]["rounding"] = step.rounding.rounding;
      r.details["rounding"]["evidence"] = step.rounding.sentence;
    }
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(GradientsCheck);

}  // namespace ckcheck
