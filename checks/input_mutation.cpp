// input-mutation: a checkpointed site's input changed between entering the site and its
// recompute, so the recompute starts from other data.
#include <fmt/ranges.h>

#include <optional>
#include <set>

#include "checks/common.h"
#include "checks/evidence.h"

namespace ckcheck {
namespace {

// Input i of call c changed in place, during the forward or before the recompute; none if not.
std::optional<Finding> changed_input(const CallEvidence& c, size_t i) {
  Finding f;
  f.cause = Cause::kInPlace;
  f.site = c.site;
  f.tensor = fmt::format("input {}", i);
  if (i < c.versions_exit.size() && c.versions_exit[i] != c.versions_entry[i]) {
    f.message = fmt::format(
        "the site changes its input {} in place during its forward (version {} -> {}); "
        "the recompute would start from the changed data",
        i, c.versions_entry[i], c.versions_exit[i]);
    f.details = {{"input", i}, {"when", "forward"}, {"version_entry", c.versions_entry[i]},
                 {"version_exit", c.versions_exit[i]}};
  } else if (i < c.versions_recompute.size() && i < c.versions_exit.size() &&
             c.versions_recompute[i] != c.versions_exit[i]) {
    f.message = fmt::format(
        "input {} is changed in place after the site's forward and before its recompute "
        "(version {} -> {})",
        i, c.versions_exit[i], c.versions_recompute[i]);
    f.details = {{"input", i}, {"when", "between forward and recompute"},
                 {"version_exit", c.versions_exit[i]},
                 {"version_recompute", c.versions_recompute[i]}};
  } else if (i < c.content_changed.size() && c.content_changed[i]) {
    f.message = fmt::format(
        "input {}'s content changed before the recompute without a version bump (a write "
        "through .data or an untracked alias)",
        i);
    f.details = {{"input", i}, {"when", "untracked write"}};
  } else {
    return std::nullopt;
  }
  return f;
}

// The call's arguments held other tensors at the recompute than at the forward (a list, dict or
// object it is handed changed in between), and the recompute computed something else from them.
Finding changed_arguments(const CallEvidence& c) {
  Finding f;
  f.cause = Cause::kInPlace;
  f.site = c.site;
  f.tensor = "arguments";
  f.message = fmt::format(
      "the site's arguments hold {} at its forward and {} at its recompute: a list, dict or object it is "
      "handed was changed in between (an item popped, appended or replaced), and the recompute computed "
      "from what it holds then",
      count_of(c.inputs_forward, "tensor"), count_of(c.inputs_recompute, "tensor"));
  f.hint = kConsumedArgumentsHint;
  f.details = {{"inputs_forward", c.inputs_forward}, {"inputs_recompute", c.inputs_recompute},
               {"when", "between forward and recompute"}};
  return f;
}

// State the site reads, changed by someone else between its forward and its recompute.
// `interleaved`: the step's micro-batches ran every forward before the backwards (--schedule).
Finding changed_state(const CallEvidence& c, bool interleaved) {
  Finding f;
  f.cause = Cause::kInPlace;
  f.site = c.site;
  f.tensor = c.state_changed.front();
  f.message = fmt::format(
      "{} changed after the site's forward and before its recompute (by the parent{}), and the recompute read "
      "the new value",
      changed_state_names(c), interleaved ? ", a later site or the next micro-batch's forward" : " or a later site");
  f.hint = "update that state after the backward (an engine that releases a parameter brings it back before the "
           "site's backward), or clone what the site reads; do not checkpoint a site whose state changes before "
           "its backward";
  f.details = {{"changed", c.state_changed}, {"when", "between forward and recompute"}};
  if (!c.state_paths.empty()) f.details["shared_by"] = c.state_paths;
  return f;
}

class InputMutationCheck : public DeclaredCheck {
 public:
  InputMutationCheck()
      : DeclaredCheck(CheckInfo{"input-mutation", CheckKind::kHazard, 30,
          "no checkpointed site's input changes (version counter or content) between entering "
          "the site and its recompute"}) {}

  CheckResult run(const CheckContext& ctx) const override {
    if (auto compiled = skipped_when_compiled(id(), ctx)) return *compiled;
    auto r = result();
    std::set<std::pair<std::string, size_t>> seen;
    size_t calls = 0;
    for (const auto& c : ctx.records.checkpointed.calls) {
      ++calls;
      if (c.recomputed && c.inputs_recompute != c.inputs_forward) {  // input positions no longer match
        // A list the site appends to (auxiliary losses) grows in between and changes nothing it computes;
        // one the site itself changes at every call (a cache, a list it pops from) is state it keeps, which
        // the determinism probe names.
        const UnitProbe* probe = probe_for(ctx, c.site);
        const bool own = probe && !probe->handed_state.empty();
        if (!own && recompute_differs(c) && seen.insert({c.site, SIZE_MAX - 1}).second) {
          add_finding(r, changed_arguments(c));
        }
        continue;
      }
      for (size_t i = 0; i < c.versions_entry.size(); ++i) {
        if (seen.count({c.site, i})) continue;
        auto f = changed_input(c, i);
        if (!f) continue;
        seen.insert({c.site, i});
        add_finding(r, std::move(*f));
      }
    }
    // State the site reads, changed by someone else between its forward and its recompute:
    // reported where the recompute then computed something else.
    for (const auto& c : ctx.records.checkpointed.calls) {
      if (c.state_changed.empty() || !recompute_differs(c) || seen.count({c.site, SIZE_MAX})) continue;
      seen.insert({c.site, SIZE_MAX});
      add_finding(r, changed_state(c, ctx.config.schedule != Schedule::kSequential));
    }
    if (!r.findings.empty()) {
      r.status = Status::kFail;
      r.summary = fmt::format("{} changed in place", count_of(r.findings.size(), "checkpointed input"));
    } else {
      r.summary = calls == 0 ? "no checkpointed call was recorded"
                             : fmt::format("inputs of {} unchanged until their recompute",
                                           count_of(calls, "checkpointed call"));
    }
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(InputMutationCheck);

}  // namespace ckcheck
