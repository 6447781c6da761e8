// One `ckcheck run`: record what the chosen checks need, compare, and run the checks.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checks/check.h"

namespace ckcheck {

/// What a check cost in the process's CPU time (all threads): the whole of it -- the records, the
/// comparison and the checks, not loading the model -- and its parts, against one plain step.
struct CheckCost {
  double seconds = 0.0;
  double plain_step_seconds = 0.0;  // the reference step: forward, backward, recording its tensors
  std::vector<std::pair<std::string, double>> phases;  // "reference", "checkpointed", "probe", ...
  /// The cost in plain steps (0 when the plain step took no measurable time).
  double plain_steps() const { return plain_step_seconds > 0 ? seconds / plain_step_seconds : 0.0; }
};

struct RunOutcome {
  RunRecords records;
  std::vector<TensorDiff> diffs;  // reference against checkpointed, every recorded tensor
  std::vector<CheckResult> results;
  CheckCost cost;
};

/// Every tensor of `reference` against its counterpart in `checkpointed` (and the ones only the
/// checkpointed side has), in record order.
std::vector<TensorDiff> compare_records(const StepRecord& reference, const StepRecord& checkpointed,
                                        const Tolerance& tolerance);

/// Runs the steps the checks need through `runner`, then the checks, with these knob values
/// (CheckKnob::name -> value; the others at their defaults).
/// `after_records` sees the records before the checks do (data-parallel runs gather what the
/// other ranks saw there).
RunOutcome run_checks(Runner& runner, const Plan& plan, const Tolerance& tolerance,
                      const std::vector<std::unique_ptr<Check>>& checks,
                      const std::map<std::string, double>& knobs = {},
                      const std::function<void(RunRecords&)>& after_records = nullptr);

}  // namespace ckcheck
