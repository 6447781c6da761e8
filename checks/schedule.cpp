// schedule: a checkpointed unit that reads state the model's forward rewrites -- a workspace the
// parent refills, a parameter an engine gathers before each forward -- recomputes from what the
// next micro-batch's forward left there wherever training runs that forward before this backward
// (pipeline schedules, gradient accumulation with overlap, multi-forward losses). The steps run
// sequentially cannot show it; where the checkpointed step saw such state
// (CallEvidence::state_rewritten), the runner runs the plain and checkpointed steps again
// interleaved (RunRecords::interleaved_*) and this check compares them.
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>

#include "checks/common.h"
#include "checks/evidence.h"

namespace ckcheck {
namespace {

// Each site whose forward read state the forward had rewritten, with those names, in call order.
std::vector<std::pair<std::string, std::set<std::string>>> rewritten_by_site(const StepRecord& step) {
  std::vector<std::pair<std::string, std::set<std::string>>> out;
  for (const auto& c : step.calls) {
    if (c.state_rewritten.empty()) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& s) { return s.first == c.site; });
    if (it == out.end()) it = out.insert(out.end(), {c.site, {}});
    it->second.insert(c.state_rewritten.begin(), c.state_rewritten.end());
  }
  return out;
}

std::string sites_text(const std::vector<std::pair<std::string, std::set<std::string>>>& sites) {
  std::vector<std::string> parts;
  for (const auto& [site, names] : sites) parts.push_back(fmt::format("{} ({})", site, fmt::join(names, ", ")));
  return fmt::format("{}", fmt::join(parts, "; "));
}

constexpr const char* kInterleavedHint =
    "keep what a checkpointed site reads fixed until its backward: allocate it per micro-batch, pass it as an "
    "argument, or bring a released parameter back before the site's backward; else do not checkpoint the site";

// The finding of a call of the interleaved checkpointed step whose recompute read changed state.
Finding interleaved_finding(const CallEvidence& c, const TensorDiff& worst, size_t differing) {
  const auto message = fmt::format(
      "with the next micro-batch's forward run before this backward (interleaved), {} changed between the site's "
      "forward and its recompute, and the recompute read the new value: {} differ from the plain interleaved "
      "step's, the worst {} (max abs {:.3g}); `--schedule interleaved` runs the whole check so",
      changed_state_names(c), count_of(differing, "tensor"), worst.name, worst.max_abs);
  Finding f{Cause::kInPlace, c.site, c.state_changed.front(), message, kInterleavedHint};
  f.details = {{"changed", c.state_changed}, {"schedule", "interleaved"}, {"differing", differing},
               {"worst", diff_json(worst)}};
  return f;
}

CheckInfo schedule_info() {
  CheckInfo info{"schedule", CheckKind::kSymptom, 27,
                 "where a checkpointed unit reads state the forward rewrites, the interleaved steps equal the plain ones"};
  info.needs.interleaved = true;
  return info;
}

class ScheduleCheck : public DeclaredCheck {
 public:
  ScheduleCheck() : DeclaredCheck(schedule_info()) {}

  CheckResult run(const CheckContext& ctx) const override {
    if (ctx.config.schedule != Schedule::kSequential) {
      return skipped(id(), fmt::format("the steps themselves run --schedule {}", schedule_name(ctx.config.schedule)));
    }
    if (ctx.config.data_parallel) return skipped(id(), "a data-parallel run (its micro-batches are the ranks')");
    if (!ctx.records.reference.error.empty()) return reference_failed(id(), ctx);
    const auto sites = rewritten_by_site(ctx.records.checkpointed);
    if (sites.empty() || !ctx.records.interleaved_checkpointed || !ctx.records.interleaved_reference) {
      return skipped(id(), "no checkpointed unit reads state the model's forward rewrites (--schedule interleaved "
                           "runs the steps interleaved regardless)");
    }
    const auto& plain = *ctx.records.interleaved_reference;
    const auto& ckpt = *ctx.records.interleaved_checkpointed;
    if (!plain.error.empty()) {
      auto r = skipped(id(), "the plain step fails interleaved: " + plain.error);
      r.status = Status::kWarn;
      return r;
    }
    auto r = result();
    r.details["rewritten"] = sites_text(sites);
    if (!ckpt.error.empty()) {
      r.status = Status::kFail;
      r.summary = "the checkpointed step fails interleaved, the plain one does not: " + ckpt.error;
      return r;
    }
    std::vector<const TensorDiff*> differing;
    for (const auto& d : ctx.records.interleaved_diffs) {
      if (!d.equal) differing.push_back(&d);
    }
    if (differing.empty()) {
      r.summary = fmt::format("{} read state the forward rewrites, {}; interleaved, the checkpointed step equals the "
                              "plain one", count_of(sites.size(), "checkpointed unit"), sites_text(sites));
      return r;
    }
    const auto* worst = *std::max_element(differing.begin(), differing.end(),
                                          [](const TensorDiff* a, const TensorDiff* b) { return a->max_abs < b->max_abs; });
    std::set<std::string> named;
    for (const auto& c : ckpt.calls) {
      if (c.state_changed.empty() || !recompute_differs(c) || !named.insert(c.site).second) continue;
      add_finding(r, interleaved_finding(c, *worst, differing.size()));
    }
    if (r.findings.empty()) {
      Finding f;
      f.cause = Cause::kUnexplained;
      f.site = sites.front().first;
      f.tensor = worst->name;
      f.message = fmt::format("interleaved, {} differ from the plain interleaved step's, the worst {} (max abs {:.3g}), "
                              "and no recompute shows why; the units read state the forward rewrites: {}",
                              count_of(differing.size(), "tensor"), worst->name, worst->max_abs, sites_text(sites));
      add_finding(r, f);
    }
    r.status = Status::kFail;
    r.summary = fmt::format("interleaved, {} of {} tensors differ", differing.size(),
                            ctx.records.interleaved_diffs.size());
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(ScheduleCheck);

}  // namespace ckcheck
