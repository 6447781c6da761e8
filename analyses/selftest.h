// ckcheck selftest: each class of bug ckcheck claims to catch, planted into the user's own model and
// configuration one at a time, and what the checks said of it -- the detection matrix that tells
// what a pass is worth on this model.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "analyses/session.h"
#include "harness/runner/plant.h"

namespace ckcheck {

/// What one planted run showed: the plant, and whether it changed the checkpointed step at all.
struct PlantOutcome {
  std::string plant;  // the class's name
  std::string site;
  std::string cause;  // the cause ckcheck must name
  /// The planted checkpointed step differs from the planted plain step (a tensor, the state or a
  /// hook count), a recompute did not reproduce its forward, or ranks draw alike: a bug that is
  /// live in this configuration. A plant this
  /// configuration is immune to (a non-reentrant checkpoint keeps what a reentrant one loses) is
  /// not.
  bool manifest = false;
  /// Why the plant cannot be judged ("" when it can): the plain and the checkpointed step call the
  /// site a different number of times (a unit the model checkpoints as a closure of its own, which
  /// runs through ckcheck only when checkpointed).
  std::string invalid;
};

/// A plant from its spec, CLASS@SITE, at a site of `model`; throws UsageError naming the classes or
/// the sites.
std::shared_ptr<Plant> make_plant(const std::string& spec, Model& model);

/// What the planted run `outcome` showed of `plant`.
PlantOutcome plant_outcome(const Plant& plant, const RunOutcome& outcome, const RunConfig& config);

/// One cell of the matrix: a class planted at a site, and what the checks said.
struct SelftestCell {
  std::string plant, site, cause;
  /// caught (a failing check named the class's cause), other-cause (the verdict failed, with other
  /// causes), missed (the verdict passed), dormant (the plant did not change the step: this
  /// configuration is immune to it), error (the planted run could not be made).
  std::string outcome;
  std::vector<std::string> found;  // the causes of the failing checks' findings
  std::string note;
  double cpu_seconds = 0.0;
  std::string reproduce;  // the ckcheck run --plant command of this cell
};

/// Judges one planted run from its verdict and checks.
SelftestCell judge_plant(const PlantOutcome& outcome, const std::vector<CheckResult>& results);

/// Why a class cannot be planted in this configuration ("" when it can): autocast-lost needs
/// --amp, rank-same-mask several ranks.
std::string plant_not_applicable(PlantKind kind, const RunConfig& config, int world_size);

/// The cells to plant: every applicable class at a sample of the plan's units (class k at unit k,
/// round the units), or at every unit.
std::vector<std::pair<PlantKind, std::string>> plant_cells(const Plan& plan, const std::vector<PlantKind>& kinds,
                                                          bool every_site);

struct SelftestResult {
  struct ClassRow {
    std::string plant, cause, what;
    std::string not_applicable;  // why not, "" when it applies
  };
  std::vector<ClassRow> classes;
  std::vector<std::string> sites;  // the units planted at
  Verdict unplanted = Verdict::kPass;
  std::vector<std::string> unplanted_failing;  // "check (causes)" of the unplanted run's failing checks
  std::vector<SelftestCell> cells;
  double cpu_seconds = 0.0;          // the whole selftest: every run's records, comparisons and checks
  double plain_step_seconds = 0.0;   // the unplanted run's plain step

  size_t count(const std::string& outcome) const;
  /// Live cells (neither dormant nor errors) caught with the right cause, of all live cells.
  double caught_share() const;
};

}  // namespace ckcheck
