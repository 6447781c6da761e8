// Diagnosis: where and why a checkpointed run diverges or turns NaN. Site bisection finds the
// checkpointed units whose checkpointing changes the result, an op-level diff of the forward and
// the recompute finds the first op that differs, and the NaN origin is the first op whose output
// is not finite, with and without checkpointing.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "checks/check.h"
#include "analyses/session.h"

namespace ckcheck {

/// One side of an op in the diff.
struct OpView {
  int64_t index = -1;  // position among the call's ops (pre-order)
  std::string name;
  int depth = 0;
  std::string site;
  std::string shapes;
  std::string dtypes;
  std::string autocast;
};

/// What differs at the first divergent op.
enum class OpDifference {
  kNone,      // nothing: the ops agree
  kName,      // another op ran
  kShape,     // an output of another shape
  kDtype,     // an output of another dtype
  kAutocast,  // under another autocast state
  kValues,    // other output values
  kCount,     // the forward and the recompute ran different numbers of ops
  kError,     // the recompute threw at this op
};
/// "name", "shape", "dtype", "autocast", "values", "count", "error" ("" for kNone).
const char* op_difference_name(OpDifference what);

struct OpDiff {
  std::string site;       // the checkpointed unit diffed
  int64_t index = -1;     // first divergent op, -1 when forward and recompute agree op for op
  OpDifference what = OpDifference::kNone;
  std::string innermost;  // the first divergent op nested deepest under it ("" when it is itself)
  double max_abs = 0.0;   // for "values", when both outputs were kept
  OpView forward, recompute;
  int64_t forward_ops = 0, recompute_ops = 0;
  /// Side by side around the divergence: forward op, recompute op, and whether they agree.
  std::vector<std::pair<OpView, OpView>> context;
  std::vector<bool> context_same;
  std::string note;  // why no diff could be made, if none
};

struct NanOrigin {
  bool found = false;
  Phase phase = Phase::kForward;
  std::string op;
  std::string site;
  std::string node;  // the autograd node, in the backward
  int64_t index = -1;
};

struct SiteDiagnosis {
  std::string site;
  Cause cause = Cause::kNonDeterministic;
  std::string evidence;
  std::string hint;
};

struct Diagnosis {
  bool diverges = false;        // checkpointing changes a compared tensor
  bool non_finite = false;      // NaN/Inf in either run
  std::vector<SiteDiagnosis> sites;  // the smallest set of units whose checkpointing diverges
  bool interaction = false;     // no unit diverges alone; the set only together
  int64_t bisection_runs = 0;
  std::optional<OpDiff> op_diff;
  NanOrigin nan_reference, nan_checkpointed;
  std::string summary;
};

/// Diagnoses a run whose outcome (records and check results) is at hand. Runs further steps
/// through `runner`: one per bisection test, one traced checkpointed step, and two traced steps
/// for the NaN origin when there is NaN.
Diagnosis diagnose(Runner& runner, const Plan& plan, const Tolerance& tolerance,
                   const RunOutcome& outcome);

}  // namespace ckcheck
