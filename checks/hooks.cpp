// hooks: under the checkpointed step every parameter's gradient hook fires exactly as often as
// under the plain step (once per backward). Data-parallel training marks a parameter ready in
// that hook; a reentrant checkpoint that runs the same module twice fires it twice ("Expected to
// mark a variable ready only once"), and one that loses a gradient never fires it (DDP hangs).
#include "checks/common.h"
#include "checks/evidence.h"
#include "harness/support/text.h"

namespace ckcheck {
namespace {

class HooksCheck : public DeclaredCheck {
 public:
  HooksCheck()
      : DeclaredCheck(CheckInfo{"hooks", CheckKind::kTraining, 100,
          "every parameter's gradient hook fires once per backward under checkpointing, as "
          "data-parallel training (DDP) requires"}
          .needing(&Needs::hooks)) {}

  CheckResult run(const CheckContext& ctx) const override {
    auto r = result();
    const auto& ckpt = ctx.records.checkpointed.hooks;
    // A data-parallel engine (DDP) that stopped the step: its reducer's own message, naming the
    // parameter where it does ("... with name NAME ..."). The counts are those of the backwards
    // that finished.
    const auto& error = ctx.records.checkpointed.error;
    const auto meaning = error.empty() ? std::nullopt : pytorch_error_meaning(error);
    const bool engine_stopped = meaning && meaning->cause == Cause::kHookCount;
    if (ckpt.empty() && !engine_stopped) {
      return skipped(id(), error.empty()
                               ? "no gradient hook was counted"
                               : "the checkpointed step failed before its hooks could be counted");
    }
    // FSDP2 counts its own hooks, one per gradient it reduced; DDP's reducer marks parameters ready.
    const auto* dp = ctx.config.data_parallel;
    const bool fsdp = dp && dp->engine() && dp->engine()->engine() == ParallelKind::kFsdp;
    size_t counted = 0;
    for (const auto& h : ckpt) {
      ++counted;
      if (fires_as_plain(ctx, h)) continue;
      add_finding(r, hook_finding(ctx, h, fsdp, engine_stopped));
    }
    if (r.findings.empty() && engine_stopped) {
      Finding f;
      f.cause = Cause::kHookCount;
      f.tensor = text_after(error, "with name ", " \n,");
      f.site = f.tensor.empty() ? site_of_pytorch_error(ctx, f.cause) : owning_unit(ctx.plan, f.tensor);
      f.message = fmt::format("the data-parallel engine stopped the checkpointed step: {}; {}", first_line(error),
                              meaning->evidence);
      add_finding(r, f);
    }
    if (!r.findings.empty()) {
      r.status = Status::kFail;
      r.summary = fmt::format("{} fire other than once per backward under checkpointing",
                              count_of(r.findings.size(), "parameter hook"));
    } else {
      r.summary = fmt::format("{} fire once per backward, as under the plain step", count_of(counted, "parameter hook"));
    }
    return r;
  }

 private:
  // A parameter whose hook fired otherwise than in the plain step, and what the engine makes of it.
  static Finding hook_finding(const CheckContext& ctx, const HookCount& h, bool fsdp, bool engine_stopped) {
    const int64_t expected = plain_fires(ctx, h);
    Finding f;
    f.cause = Cause::kHookCount;
    f.site = owning_unit(ctx.plan, h.name);
    f.tensor = h.name;
    f.details = {{"fires", h.fires}, {"plain_fires", expected}, {"step", h.step}};
    if (expected == 0) {
      f.message = fmt::format("the gradient hook of {} fires {} times in one backward under checkpointing where "
                              "the plain step never reaches it: {}",
                              h.name, h.fires,
                              fsdp            ? "FSDP2 reduced a gradient the plain step does not have"
                              : h.fires > 1 ? "DDP would mark it ready twice and stop"
                                              : "DDP would reduce a gradient the plain step does not have");
    } else if (h.fires > expected) {
      f.message = fmt::format("the gradient hook of {} fires {} times in one backward under checkpointing ({} plain): {}",
                              h.name, h.fires, expected,
                              fsdp ? "FSDP2 reduced its gradient more than once" : "DDP would mark it ready twice and stop");
    } else if (fsdp) {
      f.message = fmt::format("the gradient hook of {} never fires under checkpointing ({} plain): FSDP2 never "
                              "reduced a gradient for it",
                              h.name, expected);
    } else {
      f.message = fmt::format("the gradient hook of {} never fires under checkpointing ({} plain): DDP {} for it",
                              h.name, expected, engine_stopped ? "stopped the step waiting" : "would wait forever");
    }
    return f;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(HooksCheck);

}  // namespace ckcheck
