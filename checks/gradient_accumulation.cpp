// gradient-accumulation: under gradient accumulation (--accumulate N: N micro-batches per step,
// each with its forward and backward, their gradients summed before the update) the checkpointed
// step's summed gradients equal those of N plain micro-batches, bitwise, and every parameter's
// gradient hook fires once per micro-batch, as under the plain step (data-parallel training
// marks a parameter ready in that hook on the last micro-batch, after no_sync on the others).
//
// The evidence that names the cause: each parameter's gradient as it stands after every
// micro-batch but the last. When the first micro-batch's gradients agree and a later one's do not,
// the checkpointed step changed the gradients accumulated before it (a hook, a gradient-release
// optimisation or a hand-written checkpoint that assigns or frees .grad): cause accumulated-grad.
#include "checks/common.h"
#include "checks/evidence.h"

namespace ckcheck {
namespace {

constexpr CauseWord kAccumulatedGradWord{
    "accumulated-grad",
    "something in the checkpointed region (a hook, a gradient-release optimisation, a hand-written "
    "checkpoint) assigns or frees .grad during the recompute: accumulate into .grad, never assign or "
    "clear it before the optimizer step"};
const Cause kAccumulatedGrad{kAccumulatedGradWord};

// For each parameter whose summed gradient differs, the first micro-batch after which its
// accumulated gradient differs (from the partial-sum records, each with its parameter and
// micro-batch; the number of micro-batches when only the sum does).
std::map<std::string, int64_t> first_differing_micro_batch(const CheckContext& ctx) {
  std::map<std::string, int64_t> first;
  for (const auto& d : ctx.diffs) {
    if (d.kind != kPartialGradKind || d.equal) continue;
    auto it = first.find(d.parameter);
    if (it == first.end() || d.micro_batch < it->second) first[d.parameter] = d.micro_batch;
  }
  // Equal after every micro-batch but the last: the sum is the first to differ.
  for (const auto& d : ctx.diffs) {
    if (d.kind == "param-grad" && !d.equal && !first.count(d.name)) first[d.name] = ctx.config.accumulate;
  }
  return first;
}

void add_gradient_findings(const CheckContext& ctx, CheckResult& r) {
  const auto partial = first_differing_micro_batch(ctx);
  const auto explained = explain_sites(ctx);
  const auto rounding_found = rounding_evidence(ctx, explained);
  const bool rounding = rounding_found.rounding;
  for (const auto& d : ctx.diffs) {
    if (d.kind != "param-grad" || d.equal) continue;
    const int64_t at = partial.at(d.name);  // the micro-batch after which it first differs
    Finding f;
    f.site = owning_unit(ctx.plan, d.name);
    f.tensor = d.name;
    f.details = {{"sum", diff_json(d)}, {"first_micro_batch_differing", at}};
    if (rounding) {
      // Each checkpointed call's part added to .grad on its own: the same sum in another order.
      f.cause = Cause::kAccumulationOrder;
      f.message = fmt::format("the gradient of {} summed over {} micro-batches differs by rounding only (max abs "
                              "{:.3g}): {}",
                              d.name, ctx.config.accumulate, d.max_abs, rounding_found.sentence);
    } else if (at > 1) {
      // Equal after the first micro-batch, different later: the step changed what was accumulated.
      f.cause = kAccumulatedGrad;
      f.message = fmt::format(
          "the gradient of {} summed over {} micro-batches differs from the plain micro-batches' (max abs {:.3g}): "
          "equal after micro-batch 1, it first differs after micro-batch {}, so the checkpointed step changed "
          "the gradient accumulated before it",
          d.name, ctx.config.accumulate, d.max_abs, at);
    } else {
      f.cause = explained.empty() ? Cause::kNonDeterministic : explained.front().cause;
      if (!explained.empty()) f.site = explained.front().site;
      f.message = fmt::format("the gradient of {} differs already after the first micro-batch (max abs {:.3g}), as "
                              "it would without accumulation: see the gradients check",
                              d.name, d.max_abs);
    }
    add_finding(r, f);
  }
}

void add_hook_findings(const CheckContext& ctx, CheckResult& r) {
  for (const auto& h : ctx.records.checkpointed.hooks) {
    if (fires_as_plain(ctx, h)) continue;
    const int64_t plain = plain_fires(ctx, h);
    Finding f;
    f.cause = Cause::kHookCount;
    f.site = owning_unit(ctx.plan, h.name);
    f.tensor = h.name;
    f.details = {{"fires", h.fires}, {"plain_fires", plain}, {"micro_batch", h.micro_batch}, {"step", h.step}};
    f.message = fmt::format("the gradient hook of {} fires {} times in micro-batch {} under checkpointing ({} plain)",
                            h.name, h.fires, h.micro_batch, plain);
    add_finding(r, f);
  }
}

class GradientAccumulationCheck : public DeclaredCheck {
 public:
  GradientAccumulationCheck()
      : DeclaredCheck(CheckInfo{"gradient-accumulation", CheckKind::kTraining, 110,
          "with --accumulate N: N checkpointed micro-batches sum to the gradients of N plain ones, bitwise, "
          "and every gradient hook fires once per micro-batch"}
          .applying(Applies::kWithAccumulation)
          .needing(&Needs::hooks)
          .with_causes({kAccumulatedGrad})) {}

  CheckResult run(const CheckContext& ctx) const override {
    auto r = result();
    if (ctx.config.accumulate < 2) {
      return skipped(id(), "one micro-batch per step (--accumulate N runs N)");
    }
    if (!ctx.records.reference.error.empty()) return reference_failed(id(), ctx);
    if (!ctx.records.checkpointed.error.empty()) {
      return checkpointed_failed(id(), ctx, "the checkpointed step failed: ", "the checkpointed step failed");
    }
    add_gradient_findings(ctx, r);
    add_hook_findings(ctx, r);
    r.details["micro_batches"] = ctx.config.accumulate;
    const bool only_rounding = std::all_of(r.findings.begin(), r.findings.end(),
                                           [](const Finding& f) { return f.cause == Cause::kAccumulationOrder; });
    if (!r.findings.empty() && only_rounding) {
      r.status = Status::kWarn;
      r.summary = fmt::format("{} micro-batches: summed gradients differ by rounding only, every hook once per "
                              "micro-batch", ctx.config.accumulate);
      return r;
    }
    if (!r.findings.empty()) {
      r.status = Status::kFail;
      r.summary = fmt::format("{} over {} micro-batches", count_of(r.findings.size(), "difference"), ctx.config.accumulate);
      return r;
    }
    r.summary = fmt::format("{} micro-batches: summed gradients equal bitwise, every hook once per micro-batch",
                            ctx.config.accumulate);
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(GradientAccumulationCheck);

}  // namespace ckcheck
