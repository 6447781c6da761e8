// collectives (a ledger of what the recompute sends): each checkpointed call records the
// collectives and point-to-point operations (c10d's ops) its forward and its recompute issue, with
// the tensors they carry. Tensor, sequence and context parallel layers issue them inside the
// checkpointed blocks, so the recompute issues them again: one it drops leaves a partial sum where
// the forward had the total (a compiler pass that never enters the checkpointed region), one it adds
// or carries other tensors pairs with another rank's other collective (a hang, or corrupted data).
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "checks/common.h"
#include "checks/evidence.h"

namespace ckcheck {

// The fix: the same collectives in both passes, or none in the recompute.
constexpr const char kSameCollectivesHint[] =
    "make the recompute issue exactly the collectives its forward issued, on the same group with the same tensors: "
    "no branch on whether it is recomputing, a call count or a cache; or keep the collective's output (a "
    "selective-checkpoint policy that saves it) so the recompute does not issue it";
constexpr CauseWord kRecomputeCollectiveWord{"recompute-collective", kSameCollectivesHint};
const Cause kRecomputeCollective{kRecomputeCollectiveWord};

namespace {

Finding parting_finding(const CallEvidence& c, const CollectiveParting& p, bool values_differ) {
  Finding f{kRecomputeCollective, c.site, p.forward.empty() ? p.recompute : p.forward,
            collective_parting_words(c, p) +
                (values_differ ? ", and recomputed other values than its forward"
                               : "; the recompute still reproduced its forward's outputs here, but ranks that "
                                 "issue other collectives pair them with their peers' other ones (a hang, or "
                                 "corrupted data)"),
            kSameCollectivesHint};
  f.details = {{"forward", c.forward_collectives}, {"recompute", c.recompute_collectives}, {"at", p.at}};
  return f;
}

CheckInfo collectives_info() {
  return CheckInfo{"collectives", CheckKind::kTraining, 135,
                   "each checkpointed call's recompute issues the collectives its forward issued, in order, "
                   "with the same tensors"}
      .with_causes({kRecomputeCollective});
}

class CollectivesCheck : public DeclaredCheck {
 public:
  CollectivesCheck() : DeclaredCheck(collectives_info()) {}

  CheckResult run(const CheckContext& ctx) const override {
    auto r = result();
    size_t issuing = 0, differ = 0;
    std::set<std::string> named;
    for (const auto& c : ctx.records.checkpointed.calls) {
      if (!c.forward_collectives.empty() || !c.recompute_collectives.empty()) ++issuing;
      const auto p = collective_parting(c);
      if (!p || !named.insert(c.site).second) continue;
      const bool values_differ = recompute_differs(c) || c.recompute_failed;
      differ += values_differ ? 1 : 0;
      add_finding(r, parting_finding(c, *p, values_differ));
    }
    if (issuing == 0) {
      return skipped(id(), ctx.records.ranks.size() < 2 ? "a single process (--world-size 1)"
                                                          : "no checkpointed call issued a collective");
    }
    if (!r.findings.empty()) {
      r.status = differ > 0 ? Status::kFail : Status::kWarn;
      r.summary = fmt::format("{} recompute other collectives than their forward", count_of(named.size(), "site"));
      return r;
    }
    r.summary = fmt::format("{} recompute the collectives their forward issued", count_of(issuing, "checkpointed call"));
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(CollectivesCheck);

}  // namespace ckcheck
