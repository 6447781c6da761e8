// Reading the Runner's evidence: which checkpointed site explains a difference, and why. The
// symptom checks (gradients, buffers) use it to name the cause of what they see.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "checks/check.h"

namespace ckcheck {

struct SiteExplanation {
  std::string site;
  Cause cause = Cause::kNonDeterministic;
  std::string evidence;  // one sentence
};

/// The probe of a unit, if the probe ran.
const UnitProbe* probe_for(const CheckContext& ctx, const std::string& site);

/// The first index at which the forward's and the recompute's op dtypes differ, if they do.
std::optional<size_t> first_dtype_difference(const CallEvidence& call);

/// True when a call's recompute did not reproduce its forward outputs bitwise.
bool recompute_differs(const CallEvidence& call);

/// For every checkpointed unit whose evidence shows a hazard, its cause, in plan order.
std::vector<SiteExplanation> explain_sites(const CheckContext& ctx);

/// The checkpointed unit a tensor belongs to ("blocks.1.bn1.running_mean" -> "blocks.1"), or "".
std::string owning_unit(const Plan& plan, const std::string& tensor_name);

}  // namespace ckcheck
