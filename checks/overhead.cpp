// overhead (run --bench): checkpointing adds at most the stated share of the plain step's time
// (50% by default: the field guide expects 20-40%, and more than 50% means checkpoints too fine).
#include "checks/overhead.h"

#include "checks/common.h"

namespace ckcheck {
namespace {

const CheckKnob kMaxOverhead{"max-overhead", "with --bench: the most step time checkpointing may add (0.5 = +50%)", 0.5,
                             0.0, 1e6, /*min_open=*/true};

// The median of the checkpointed step's time over the plain step's, step by step: the runner
// alternates the two, so each ratio compares steps that ran under the same load.
double median_ratio(const std::vector<double>& plain, const std::vector<double>& checkpointed) {
  std::vector<double> ratios;
  for (size_t i = 0; i < std::min(plain.size(), checkpointed.size()); ++i) {
    if (plain[i] > 0) ratios.push_back(checkpointed[i] / plain[i]);
  }
  return ratios.empty() ? 1.0 : median(ratios);
}

class OverheadCheck : public DeclaredCheck {
 public:
  OverheadCheck()
      : DeclaredCheck(CheckInfo{"overhead", CheckKind::kMeasurement, 90,
          "(with --bench) checkpointing adds at most --max-overhead (50%) to the step time"}
          .applying(Applies::kWithBench)
          .needing(&Needs::bench)
          .with_knobs({kMaxOverhead})) {}

  CheckResult run(const CheckContext& ctx) const override {
    auto r = result();
    const auto& plain = ctx.records.bench_plain;
    const auto& ckpt = ctx.records.bench_checkpointed;
    if (!plain || !ckpt || plain->step_seconds.empty() || ckpt->step_seconds.empty()) {
      return skipped(id(), plain && !plain->error.empty() ? "measurement failed: " + plain->error
                                                          : "not measured (run with --bench)");
    }
    const double a = median(plain->step_seconds), b = median(ckpt->step_seconds);
    const double over = median_ratio(plain->step_seconds, ckpt->step_seconds) - 1.0;
    r.details = {{"plain_median_s", a}, {"checkpointed_median_s", b}, {"overhead", over},
                 {"bound", ctx.knob(kMaxOverhead)}, {"forward_median_s", median(plain->forward_seconds)}};
    if (over <= ctx.knob(kMaxOverhead)) {
      r.summary = fmt::format("step time {:+.0f}% with checkpointing (bound {:.0f}%)", 100 * over, 100 * ctx.knob(kMaxOverhead));
      return r;
    }
    r.status = Status::kFail;
    Finding f;
    f.cause = Cause::kTooFine;
    f.message = fmt::format("checkpointing adds {:.0f}% to the step time ({:.3g} s -> {:.3g} s), more "
                            "than the {:.0f}% bound",
                            100 * over, a, b, 100 * ctx.knob(kMaxOverhead));
    add_finding(r, f);
    r.summary = fmt::format("step time {:+.0f}%, over the {:.0f}% bound", 100 * over, 100 * ctx.knob(kMaxOverhead));
    return r;
  }
};

}  // namespace

const CheckKnob& max_overhead_knob() { return kMaxOverhead; }

CKCHECK_REGISTER_CHECK(OverheadCheck);

}  // namespace ckcheck
