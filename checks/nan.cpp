// nan: NaN or Inf in the loss, outputs or gradients of either step, and whether checkpointing
// introduced it. `ckcheck diagnose` finds the op that produced it.
#include "checks/common.h"

namespace ckcheck {
namespace {

class NanCheck : public DeclaredCheck {
 public:
  NanCheck()
      : DeclaredCheck(CheckInfo{"nan", CheckKind::kSymptom, 70,
          "no NaN or Inf in the loss, outputs or gradients, with or without checkpointing"}) {}

  CheckResult run(const CheckContext& ctx) const override {
    auto r = result();
    // Two findings at most: NaN/Inf that exists without checkpointing too, and NaN/Inf that only
    // the checkpointed step has.
    struct Group {
      std::vector<std::string> tensors;
      int64_t reference = 0, checkpointed = 0;
    };
    Group both, introduced;
    for (const auto& d : ctx.diffs) {
      if (is_state_kind(d.kind)) continue;
      if (d.nonfinite_reference == 0 && d.nonfinite_checkpointed == 0) continue;
      auto& g = d.nonfinite_reference > 0 ? both : introduced;
      g.tensors.push_back(d.name);
      g.reference += d.nonfinite_reference;
      g.checkpointed += d.nonfinite_checkpointed;
    }
    auto add = [&](const Group& g, bool without) {
      if (g.tensors.empty()) return;
      Finding f;
      f.cause = Cause::kNonFinite;
      f.tensor = g.tensors.front();
      f.details = {{"tensors", g.tensors}, {"nonfinite_reference", g.reference},
                   {"nonfinite_checkpointed", g.checkpointed}, {"without_checkpointing", without}};
      f.message = fmt::format(
          "{} ({}{}) hold {} NaN/Inf values with checkpointing and {} without{}",
          count_of(g.tensors.size(), "tensor"), g.tensors.front(),
          g.tensors.size() > 1 ? fmt::format(", {}", g.tensors.size() > 2 ? g.tensors[1] + ", ..." : g.tensors[1]) : "",
          g.checkpointed, g.reference,
          without ? ": the NaN exists without checkpointing too" : ": checkpointing introduced it");
      f.hint = "run `ckcheck diagnose` with the same options to find the first op that produced it";
      add_finding(r, f);
    };
    add(both, true);
    add(introduced, false);
    if (!r.findings.empty()) {
      r.status = Status::kFail;
      r.summary = fmt::format("{} hold NaN/Inf ({} only with checkpointing)",
                              count_of(both.tensors.size() + introduced.tensors.size(), "tensor"),
                              introduced.tensors.size());
    } else {
      r.summary = "no NaN or Inf in losses, outputs or gradients";
    }
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(NanCheck);

}  // namespace ckcheck
