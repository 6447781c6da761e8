// Small helpers shared by the check files.
#pragma once

#include <optional>

#include <fmt/format.h>

#include <string>

#include "checks/check.h"

namespace ckcheck {

/// Findings beyond this many per check are counted in the summary, not listed.
constexpr size_t kMaxFindings = 25;

/// Adds a finding unless the check already lists kMaxFindings; returns whether it was added.
bool add_finding(CheckResult& r, Finding f);

/// The offload check's word (checks/offload.cpp): gradients gives it to a tensor that the offload's
/// hooks change in the plain step already.
extern const Cause kOffload;

/// "3 findings" / "1 finding" style.
std::string count_of(size_t n, const std::string& what);

/// The JSON form of a TensorDiff (the report's "tensors" entries use it too).
nlohmann::json diff_json(const TensorDiff& d);

/// The results a check returns when it cannot judge: skipped (nothing to look at: not asked for,
/// not measured, nothing checkpointed) or errored (what it needed failed), with one line why.
CheckResult skipped(const std::string& id, std::string summary);
CheckResult errored(const std::string& id, std::string summary);

/// Under --compile the checkpointed units run inside the compiled graph, where no call reaches the
/// runner: a check that reads the evidence of each call is skipped with that reason (the step's
/// comparison and the compiled graphs stand for them). Nothing when the model ran eagerly.
std::optional<CheckResult> skipped_when_compiled(const std::string& id, const CheckContext& ctx);

/// Whether the checkpointed step ran and every tensor it recorded (loss, outputs, gradients, state)
/// equals the plain step's within the tolerance: a hazard seen in the recompute then changed
/// nothing in this step, and warns instead of failing. False when nothing was compared.
bool checkpointed_step_unchanged(const CheckContext& ctx);

/// A CheckResult for when the reference step itself failed: nothing can be compared.
CheckResult reference_failed(const std::string& id, const CheckContext& ctx);

/// When two plain steps from the same restored state already differ, checkpointing cannot be
/// judged: the result that says so (status error), or nothing when the plain step repeats.
std::optional<CheckResult> plain_not_repeatable(const std::string& id, const CheckContext& ctx);

/// What one of PyTorch's own errors in a checkpointed step means: its cause and the evidence in
/// words (the version counter's in-place error, a reentrant checkpoint's inputs without grad,
/// CheckpointError's metadata and count mismatches). Nothing for other errors.
struct PytorchErrorMeaning {
  Cause cause;
  std::string evidence;
  bool checkpoint_error = false;  // a CheckpointError (metadata or count of saved tensors)
};
std::optional<PytorchErrorMeaning> pytorch_error_meaning(const std::string& error);

/// The site PyTorch's error most likely comes from, when its message does not name one: the first
/// checkpointed call whose recompute failed or differed, else (by cause) one whose inputs need no
/// grad, the last one the forward ran, or the first not recomputed.
std::string site_of_pytorch_error(const CheckContext& ctx, const Cause& cause);

/// A failing CheckResult for when the checkpointed step failed and the plain one did not, with
/// the cause and site the evidence gives (the first explained site), or non-deterministic.
CheckResult checkpointed_failed(const std::string& id, const CheckContext& ctx, const std::string& message_prefix,
                                const std::string& summary);

}  // namespace ckcheck
