// buffers: all of the model's state after the checkpointed step against the plain step's --
// buffers, tensors and numbers kept as attributes, training flags, other state a model declares.
// BatchNorm's running statistics (or any counter or running average) must be updated once per
// step, not again by the recompute.
#include <algorithm>

#include "checks/common.h"
#include "checks/evidence.h"

namespace ckcheck {
namespace {

// One finding per (cause, unit), with the names of the state entries it covers.
using StateGroups = std::vector<std::pair<Finding, std::vector<std::string>>>;

// Adds differing state entry d to its group: buffer-update, unless the unit's recompute is already
// explained by a stateful site or the RNG.
void add_to_group(StateGroups& groups, const CheckContext& ctx, const std::vector<SiteExplanation>& explained,
                  const TensorDiff& d) {
  Finding f;
  f.site = owning_unit(ctx.plan, d.name);
  auto e = std::find_if(explained.begin(), explained.end(), [&](const SiteExplanation& x) { return x.site == f.site; });
  const bool other = e != explained.end() && (e->cause == Cause::kStateful || e->cause == Cause::kRng);
  f.cause = other ? e->cause : Cause::kBufferUpdate;
  auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) {
    return g.first.cause == f.cause && g.first.site == f.site;
  });
  if (it == groups.end()) {
    const auto name = state_display_name(d.name);
    const auto what = state_kind_words(d.kind);
    f.tensor = name;
    f.details = {{"first", diff_json(d)}, {"kind", what}};
    f.message = other ? fmt::format("{} ({}) differs after step {}: {}", name, what, d.step, e->evidence)
                      : fmt::format("{} ({}) differs after step {} (max abs {:.3g}): the forward "
                                    "updated it and the recompute updated it again",
                                    name, what, d.step, d.max_abs);
    groups.push_back({f, {}});
    it = groups.end() - 1;
  }
  it->second.push_back(state_display_name(d.name));
}

class BuffersCheck : public DeclaredCheck {
 public:
  BuffersCheck()
      : DeclaredCheck(CheckInfo{"buffers", CheckKind::kSymptom, 20,
          "all model state after the step -- buffers, tensor and scalar attributes, training flags -- equals "
          "the plain step's (BatchNorm statistics and counters updated once, not twice)"}) {}

  CheckResult run(const CheckContext& ctx) const override {
    if (!ctx.records.reference.error.empty()) return reference_failed(id(), ctx);
    auto r = result();
    if (!ctx.records.checkpointed.error.empty()) {
      return checkpointed_failed(id(), ctx, "the checkpointed step failed before its buffers could be compared: ",
                                 "the checkpointed step failed");
    }
    if (auto not_repeatable = plain_not_repeatable(id(), ctx)) return *not_repeatable;
    size_t compared = 0, differing = 0;
    const auto explained = explain_sites(ctx);
    StateGroups groups;
    for (const auto& d : ctx.diffs) {
      if (!is_state_kind(d.kind) || d.kind == state_kind::kGlobal) continue;  // side-effects compares those
      ++compared;
      if (d.equal) continue;
      ++differing;
      add_to_group(groups, ctx, explained, d);
    }
    for (auto& [f, names] : groups) {
      f.details["buffers"] = names;
      if (names.size() > 1) f.message = fmt::format("{} state entries differ, first {}", names.size(), f.message);
      add_finding(r, f);
    }
    r.details["compared"] = compared;
    r.details["differing"] = differing;
    if (differing > 0) {
      r.status = Status::kFail;
      r.summary = fmt::format("{} of {} state entries differ after the step", differing, compared);
    } else {
      r.summary = compared == 0 ? "the model has no state besides its parameters"
                                : fmt::format("{} state entries equal after the step", compared);
    }
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(BuffersCheck);

}  // namespace ckcheck
