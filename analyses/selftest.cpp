#include "analyses/selftest.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "harness/support/errors.h"

namespace ckcheck {

std::shared_ptr<Plant> make_plant(const std::string& spec, Model& model) {
  std::vector<std::string> names;
  for (const auto& c : plant_classes()) names.push_back(c.name);
  const auto at = spec.find('@');
  const auto kind = parse_plant_kind(spec.substr(0, at));
  if (at == std::string::npos || !kind) {
    throw FieldError("plant", fmt::format("@plant '{}': give CLASS@SITE, CLASS one of {}", spec, fmt::join(names, ", ")));
  }
  const auto site = spec.substr(at + 1);
  const auto sites = model.sites();
  if (std::find(sites.begin(), sites.end(), site) == sites.end()) {
    throw FieldError("plant", fmt::format("@plant '{}': the model has no site '{}'; its sites: {}", spec, site,
                                          fmt::join(sites, ", ")));
  }
  return std::make_shared<Plant>(*kind, site);
}

namespace {

// A hook counted in the checkpointed step that fires otherwise than the same hook in the plain step.
bool hooks_differ(const RunRecords& records) {
  for (const auto& h : records.checkpointed.hooks) {
    int64_t plain = 0;
    for (const auto& p : records.reference.hooks) {
      if (p.same_point(h)) plain = p.fires;
    }
    // As the hooks check counts it: once without a gradient where plain never fires is plain's.
    const bool as_plain = h.fires == plain || (plain == 0 && h.fires == 1 && h.fires_without_gradient == 1);
    if (!as_plain) return true;
  }
  return false;
}

}  // namespace

PlantOutcome plant_outcome(const Plant& plant, const RunOutcome& outcome, const RunConfig& config) {
  const auto& c = plant_class(plant.kind());
  PlantOutcome o;
  o.plant = c.name;
  o.site = plant.site();
  o.cause = c.cause;
  const auto& calls = outcome.records.checkpointed.calls;
  const bool recompute_differs = std::any_of(calls.begin(), calls.end(), [](const CallEvidence& c) {
    return std::any_of(c.output_diffs.begin(), c.output_diffs.end(), [](const TensorDiff& d) { return !d.equal; });
  });
  o.manifest = std::any_of(outcome.diffs.begin(), outcome.diffs.end(), [](const TensorDiff& d) { return !d.equal; }) ||
               recompute_differs || hooks_differ(outcome.records) || !outcome.records.checkpointed.error.empty() ||
               (plant.kind() == PlantKind::kRankSameMask && config.data_parallel != nullptr);
  const auto plain = outcome.records.reference.plant_calls, checkpointed = outcome.records.checkpointed.plant_calls;
  if (plain != checkpointed) {
    o.invalid = fmt::format("the plain step calls {} {} times and the checkpointed step {} times (a unit the model "
                            "checkpoints as a closure of its own runs through ckcheck only when checkpointed): plant "
                            "at a module path",
                            plant.site(), plain, checkpointed);
  }
  return o;
}

SelftestCell judge_plant(const PlantOutcome& o, const std::vector<CheckResult>& results) {
  SelftestCell cell;
  cell.plant = o.plant;
  cell.site = o.site;
  cell.cause = o.cause;
  std::set<std::string> found;
  for (const auto& r : results) {
    if (r.status != Status::kFail && r.status != Status::kError) continue;
    for (const auto& f : r.findings) found.insert(f.cause.name());
  }
  cell.found.assign(found.begin(), found.end());
  const auto verdict = verdict_of(results);
  if (!o.invalid.empty()) {
    cell.outcome = "error";
    cell.note = o.invalid;
  } else if (!o.manifest) {
    // Nothing changed: this configuration is immune to the plant, and a failure would be a false alarm.
    cell.outcome = verdict == Verdict::kPass ? "dormant" : "false-alarm";
    cell.note = verdict == Verdict::kPass
                    ? "the planted bug changed nothing in this configuration (its checkpoint is immune to it)"
                    : "nothing changed, yet the verdict is not pass";
  } else if (verdict == Verdict::kPass) {
    cell.outcome = "missed";
  } else {
    cell.outcome = found.count(o.cause) ? "caught" : "other-cause";
    if (cell.outcome == "other-cause") {
      std::vector<std::string> said;
      for (const auto& r : results) {
        if (r.status == Status::kFail || r.status == Status::kError) said.push_back(r.id + ": " + r.summary);
      }
      cell.note = fmt::format("{}", fmt::join(said, "; "));
    }
  }
  return cell;
}

std::string plant_not_applicable(PlantKind kind, const RunConfig& config, int world_size) {
  if (kind == PlantKind::kAutocastLost && config.amp == Amp::kOff) return "needs autocast (--amp bf16 or fp16)";
  if (kind == PlantKind::kRankSameMask && world_size < 2) return "needs several ranks (--world-size 2 or more)";
  return "";
}

std::vector<std::pair<PlantKind, std::string>> plant_cells(const Plan& plan, const std::vector<PlantKind>& kinds,
                                                          bool every_site) {
  std::vector<std::string> units;
  for (const auto& u : plan.units) units.push_back(u.front());
  std::vector<std::pair<PlantKind, std::string>> cells;
  if (units.empty()) return cells;
  for (size_t k = 0; k < kinds.size(); ++k) {
    if (every_site) {
      for (const auto& u : units) cells.emplace_back(kinds[k], u);
    } else {
      cells.emplace_back(kinds[k], units[k % units.size()]);
    }
  }
  return cells;
}

size_t SelftestResult::count(const std::string& outcome) const {
  return static_cast<size_t>(
      std::count_if(cells.begin(), cells.end(), [&](const SelftestCell& c) { return c.outcome == outcome; }));
}

double SelftestResult::caught_share() const {
  const size_t live = count("caught") + count("other-cause") + count("missed");
  return live ? static_cast<double>(count("caught")) / static_cast<double>(live) : 1.0;
}

}  // namespace ckcheck
