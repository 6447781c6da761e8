// side-effects: the module-level variables of the model's own code -- counters, loss trackers,
// logs kept in a module's lists and dicts -- hold after the checkpointed step what they hold after
// the plain one. A checkpoint runs a site's Python code again in the recompute, so a write there is
// made twice (Megatron's MoE aux-loss tracker, NVIDIA/Megatron-LM#1478); the module's own state is
// the buffers check's, this is everything the code keeps outside its modules. Each call's forward
// and recompute record which variables they wrote (CallEvidence::variables_*): the site is the one
// whose recompute wrote the variable, and the line is where the code writes it.
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "checks/common.h"

namespace ckcheck {

constexpr CauseWord kSideEffectWord{"side-effect",
    "a checkpointed site's recompute runs its Python code again: keep writes to module-level state (loss trackers, "
    "counters, logs) out of the checkpointed forward -- return the term and record it in the parent, or assign by "
    "key once per step rather than append"};
const Cause kSideEffect{kSideEffectWord};

namespace {

// "FILE:NAME" of the variable a state entry "FILE:NAME.KEY.0" belongs to.
std::string variable_of(const std::string& entry) {
  const auto colon = entry.find(':');
  const auto dot = entry.find('.', colon == std::string::npos ? 0 : colon);
  return entry.substr(0, dot);
}

// What differs of one variable's entries: more, fewer or other values.
struct VariableDiff {
  size_t added = 0, removed = 0, changed = 0;
  double max_abs = 0.0;
  std::string first;
};

std::string how_it_differs(const VariableDiff& v);

// The sites whose recompute wrote `variable`, in call order, each once.
std::vector<std::string> rewriting_sites(const CheckContext& ctx, const std::string& variable) {
  std::vector<std::string> sites;
  for (const auto& c : ctx.records.checkpointed.calls) {
    const auto& w = c.variables_recompute;
    if (std::find(w.begin(), w.end(), variable) != w.end() &&
        std::find(sites.begin(), sites.end(), c.site) == sites.end()) {
      sites.push_back(c.site);
    }
  }
  return sites;
}

Finding finding_for(const CheckContext& ctx, const std::string& variable, const VariableDiff& v) {
  Finding f;
  f.cause = kSideEffect;
  f.tensor = state_display_name(variable);
  const auto sites = rewriting_sites(ctx, state_display_name(variable));
  const auto origin = ctx.model.state_origin(v.first);
  const auto where = origin.empty() ? std::string() : fmt::format(" (written at {})", origin);
  if (!sites.empty()) {
    f.site = sites.front();
    f.message = fmt::format("module-level variable {} holds something else after the checkpointed step ({}): the "
                            "recompute of {} writes it again{}",
                            f.tensor, how_it_differs(v), fmt::join(sites, ", "), where);
  } else {
    f.message = fmt::format("module-level variable {} holds something else after the checkpointed step ({}), "
                            "written otherwise than in the plain step but by no recompute{}",
                            f.tensor, how_it_differs(v), where);
  }
  f.details = {{"variable", f.tensor}, {"first", state_display_name(v.first)}, {"sites", sites},
               {"added", v.added}, {"removed", v.removed}, {"changed", v.changed}};
  if (!origin.empty()) f.details["written_at"] = origin;
  return f;
}

std::string how_it_differs(const VariableDiff& v) {
  std::vector<std::string> parts;
  if (v.added) parts.push_back(fmt::format("{} more", count_of(v.added, "entry")));
  if (v.removed) parts.push_back(fmt::format("{} fewer", count_of(v.removed, "entry")));
  if (v.changed) parts.push_back(fmt::format("{} other, by up to {:.3g}", count_of(v.changed, "value"), v.max_abs));
  return fmt::format("{}", fmt::join(parts, ", "));
}

class SideEffectsCheck : public DeclaredCheck {
 public:
  SideEffectsCheck()
      : DeclaredCheck(CheckInfo{"side-effects", CheckKind::kSymptom, 25,
          "module-level variables of the model's code (counters, loss trackers) equal the plain step's after it"}
          .with_causes({kSideEffect})) {}

  CheckResult run(const CheckContext& ctx) const override {
    if (!ctx.records.reference.error.empty()) return reference_failed(id(), ctx);
    const auto variables = ctx.model.module_variables();
    if (variables.empty()) return skipped(id(), "the model's own code keeps no module-level state");
    if (!ctx.records.checkpointed.error.empty()) {
      return checkpointed_failed(id(), ctx, "the checkpointed step failed before its module-level state could be "
                                            "compared: ", "the checkpointed step failed");
    }
    if (auto not_repeatable = plain_not_repeatable(id(), ctx)) return *not_repeatable;
    std::map<std::string, VariableDiff> differing;
    for (const auto& d : ctx.diffs) {
      if (d.kind != state_kind::kGlobal || d.equal) continue;
      auto& v = differing[variable_of(d.name)];
      if (v.first.empty()) v.first = d.name;
      if (d.missing == "reference") {
        ++v.added;
      } else if (d.missing == "checkpointed") {
        ++v.removed;
      } else {
        ++v.changed;
        v.max_abs = std::max(v.max_abs, d.max_abs);
      }
    }
    auto r = result();
    // A variable a recompute wrote is a side effect run twice: a failure. One the checkpointed step
    // writes otherwise outside every recompute (code that asks whether checkpointing is on) is
    // reported, as a warning.
    bool rewritten = false;
    for (const auto& [variable, v] : differing) {
      auto f = finding_for(ctx, variable, v);
      rewritten = rewritten || !f.site.empty();
      add_finding(r, std::move(f));
    }
    r.details["variables"] = variables.size();
    r.details["differing"] = differing.size();
    r.status = differing.empty() ? Status::kPass : rewritten ? Status::kFail : Status::kWarn;
    r.summary = differing.empty()
                    ? fmt::format("{} of the model's code equal after the step", count_of(variables.size(), "module-level variable"))
                    : fmt::format("{} of {} module-level variables differ after the step", differing.size(), variables.size());
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(SideEffectsCheck);

}  // namespace ckcheck
