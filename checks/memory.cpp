// memory (run --bench): checkpointing lowered the step's peak memory. When it does not,
// activations are not what fills memory, or the checkpoint switch is not applied.
#include "checks/common.h"

namespace ckcheck {
namespace {

class MemoryCheck : public DeclaredCheck {
 public:
  MemoryCheck()
      : DeclaredCheck(CheckInfo{"memory", CheckKind::kMeasurement, 80,
          "(with --bench) checkpointing lowers the step's peak memory"}
          .applying(Applies::kWithBench)
          .needing(&Needs::bench)) {}

  CheckResult run(const CheckContext& ctx) const override {
    auto r = result();
    const auto& plain = ctx.records.bench_plain;
    const auto& ckpt = ctx.records.bench_checkpointed;
    if (!plain || !ckpt) {
      return skipped(id(), "not measured (run with --bench)");
    }
    if (!plain->error.empty() || !ckpt->error.empty()) {
      return errored(id(), "measurement failed: " + (plain->error.empty() ? ckpt->error : plain->error));
    }
    const double a = static_cast<double>(plain->peak_bytes), b = static_cast<double>(ckpt->peak_bytes);
    r.details = {{"plain_peak_bytes", plain->peak_bytes}, {"checkpointed_peak_bytes", ckpt->peak_bytes},
                 {"baseline_bytes", plain->baseline_bytes}, {"ratio", a > 0 ? b / a : 1.0}};
    if (ctx.plan.units.empty()) {
      r.status = Status::kSkip;  // the measurements stay in the details
      r.summary = "the policy checkpoints nothing";
      return r;
    }
    if (b < a) {
      r.summary = fmt::format("peak activation memory {:.0f}% of the plain step's ({} -> {} bytes above the baseline)",
                              100 * b / a, plain->peak_bytes, ckpt->peak_bytes);
      return r;
    }
    r.status = Status::kFail;
    Finding f;
    f.cause = Cause::kNotEffective;
    f.message = fmt::format("checkpointing does not lower peak memory: {} bytes above the baseline "
                            "checkpointed, {} plain", ckpt->peak_bytes, plain->peak_bytes);
    add_finding(r, f);
    r.summary = "memory does not go down with checkpointing";
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(MemoryCheck);

}  // namespace ckcheck
