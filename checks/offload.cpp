// offload (with --offload): the offload's saved-tensor hooks give back what autograd saved. The
// checkpointed step runs offloaded; its truth is the plain step run with the same hooks against the
// plain step without them (the Python side runs both at load): packing a tensor away and bringing
// it back must not change a single value, so any difference is the offload's, checkpoints aside.
#include <fmt/ranges.h>

#include "checks/common.h"
#include "harness/support/text.h"

namespace ckcheck {

constexpr CauseWord kOffloadWord{
    "offload",
    "the offload's unpack does not give back what its pack saved (a reused or overwritten buffer, a copy not "
    "waited for, a lossy cast): copy each saved tensor into a buffer of its own and wait for the copy before "
    "the backward reads it, as torch.autograd.graph.save_on_cpu does"};
const Cause kOffload{kOffloadWord};

namespace {

class OffloadCheck : public DeclaredCheck {
 public:
  OffloadCheck()
      : DeclaredCheck(CheckInfo{"offload", CheckKind::kTraining, 145,
          "(with --offload) the offload's saved-tensor hooks give back exactly what autograd saved: the plain "
          "step offloaded equals the plain step"}
          .applying(Applies::kWithOffload)
          .with_causes({kOffload})) {}

  CheckResult run(const CheckContext& ctx) const override {
    const auto facts = ctx.model.offload_facts();
    if (!facts) return skipped(id(), "nothing offloaded (run with --offload cpu)");
    auto r = result();
    r.details = {{"hooks", facts->hooks},
                 {"packed_tensors", facts->packed},
                 {"packed_bytes", facts->packed_bytes},
                 {"differs", facts->differs},
                 {"max_rel", facts->max_rel}};
    const std::string packed = fmt::format("{}: {} packed away ({}) in the plain step", facts->hooks,
                                           count_of(static_cast<size_t>(facts->packed), "saved tensor"),
                                           format_bytes(static_cast<double>(facts->packed_bytes)));
    if (!facts->error.empty()) {
      r.status = Status::kFail;
      add_finding(r, {kOffload, "", "", "the plain step fails offloaded: " + facts->error, ""});
      r.summary = packed + "; the step fails with them";
      return r;
    }
    if (!facts->differs.empty()) {
      r.status = Status::kFail;
      add_finding(r, {kOffload, "", facts->worst,
                      fmt::format("offloaded, the plain step's {} differ{} from the plain step's (worst {}, by {:.3g} of "
                                  "its largest value): {}",
                                  count_of(facts->differs.size(), "tensor"), facts->differs.size() == 1 ? "s" : "",
                                  facts->worst, facts->max_rel, fmt::join(facts->differs, ", ")),
                      ""});
      r.summary = packed + "; they do not give back what was saved";
      return r;
    }
    r.summary = packed + "; the plain step is bitwise the same with them";
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(OffloadCheck);

}  // namespace ckcheck
