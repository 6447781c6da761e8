#include "checks/common.h"

#include <algorithm>

#include "checks/evidence.h"
#include "harness/support/text.h"

namespace ckcheck {

bool add_finding(CheckResult& r, Finding f) {
  if (r.findings.size() >= kMaxFindings) {
    r.details["findings_not_listed"] = r.details.value("findings_not_listed", 0) + 1;
    return false;
  }
  if (f.hint.empty()) f.hint = fix_hint(f.cause);
  r.findings.push_back(std::move(f));
  return true;
}

namespace {

CheckResult without_verdict(const std::string& id, Status status, std::string summary) {
  CheckResult r;
  r.id = id;
  r.status = status;
  r.summary = std::move(summary);
  return r;
}

}  // namespace

CheckResult skipped(const std::string& id, std::string summary) {
  return without_verdict(id, Status::kSkip, std::move(summary));
}

CheckResult errored(const std::string& id, std::string summary) {
  return without_verdict(id, Status::kError, std::move(summary));
}

std::optional<CheckResult> skipped_when_compiled(const std::string& id, const CheckContext& ctx) {
  if (!ctx.records.compiled) return std::nullopt;
  return skipped(id, "compiled (--compile): the units run inside the compiled graph, where ckcheck sees the whole "
                     "step and the compiled graphs, not each call");
}

std::string count_of(size_t n, const std::string& what) {
  return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s");
}

nlohmann::json diff_json(const TensorDiff& d) {
  return {{"name", d.name},
          {"kind", d.kind},
          {"step", d.step},
          {"equal", d.equal},
          {"max_abs", d.max_abs},
          {"max_rel", d.max_rel},
          {"max_ulp", d.max_ulp},
          {"mismatched", d.mismatched},
          {"numel", d.numel},
          {"first_index", d.first_index},
          {"nonfinite_reference", d.nonfinite_reference},
          {"nonfinite_checkpointed", d.nonfinite_checkpointed},
          {"missing", d.missing},
          {"note", d.note}};
}

bool checkpointed_step_unchanged(const CheckContext& ctx) {
  if (!ctx.records.checkpointed.error.empty() || ctx.diffs.empty()) return false;
  return std::all_of(ctx.diffs.begin(), ctx.diffs.end(), [](const TensorDiff& d) { return d.equal; });
}

CheckResult reference_failed(const std::string& id, const CheckContext& ctx) {
  CheckResult r;
  r.id = id;
  r.status = Status::kError;
  r.summary = "the plain (reference) step failed, so there is nothing to compare: " +
              ctx.records.reference.error;
  return r;
}

namespace {

// The part of a CheckpointError's metadata line between two of its keys ('shape' to 'dtype').
std::string metadata_field(const std::string& error, const std::string& line, const std::string& key,
                           const std::string& next) {
  const auto at = error.find(line);
  if (at == std::string::npos) return "";
  const auto begin = error.find(key, at);
  const auto end = begin == std::string::npos ? begin : error.find(next, begin);
  return end == std::string::npos ? "" : error.substr(begin, end - begin);
}

// The recomputed tensors of another shape are state that grew between the forward and the
// recompute (a KV cache appended to again); of the same shape and another dtype, autocast.
Cause metadata_cause(const std::string& error) {
  const auto shape = [&](const char* line) { return metadata_field(error, line, "'shape'", "'dtype'"); };
  const auto dtype = [&](const char* line) { return metadata_field(error, line, "'dtype'", "'device'"); };
  if (shape("saved metadata") == shape("recomputed metadata") &&
      dtype("saved metadata") != dtype("recomputed metadata")) {
    return Cause::kAutocast;
  }
  return Cause::kStateful;
}

}  // namespace

// The site a PyTorch error in the checkpointed step belongs to, from the evidence: the call whose
// recompute threw or differed; for a checkpoint none of whose inputs requires grad, the first such
// call; for a refused autograd.grad, the last call the forward ran; else the first call the
// backward never recomputed (it failed before reaching it).
std::string site_of_pytorch_error(const CheckContext& ctx, const Cause& cause) {
  const auto& calls = ctx.records.checkpointed.calls;
  const auto first = [&](auto&& pred) {
    for (const auto& c : calls) {
      if (pred(c)) return c.site;
    }
    return std::string();
  };
  auto site = first([](const CallEvidence& c) { return c.recomputed && (c.recompute_failed || recompute_differs(c)); });
  if (site.empty() && cause == Cause::kMissingGrad) site = first([](const CallEvidence& c) { return !c.inputs_require_grad; });
  if (site.empty() && cause == Cause::kGradApi) {
    // The refusal comes before any recompute, at the checkpoint the backward reaches first: the
    // last one the forward ran.
    for (auto it = calls.rbegin(); it != calls.rend() && site.empty(); ++it) {
      if (!it->recomputed) site = it->site;
    }
  }
  if (site.empty()) site = first([](const CallEvidence& c) { return !c.recomputed; });
  return site;
}

std::optional<PytorchErrorMeaning> pytorch_error_meaning(const std::string& error) {
  static const char* const kReadyTwice =
      "DistributedDataParallel's reducer: a parameter's gradient hook fired twice in one backward (a reentrant "
      "checkpoint runs its backward apart; with find_unused_parameters or a module used twice, DDP marks the "
      "parameter ready twice)";
  struct Row {
    const char* fragment;
    const Cause* cause;  // null: decided by the message (metadata_cause)
    const char* evidence;
    bool checkpoint_error;  // PyTorch's CheckpointError: more precise than ckcheck's state evidence
  };
  static const Row rows[] = {
      {"modified by an inplace operation", &Cause::kInPlace,
       "PyTorch's version counter: a tensor saved for backward was changed in place after the forward", false},
      {"does not require grad and does not have a grad_fn", &Cause::kMissingGrad,
       "no input of a reentrant checkpoint requires grad, so its outputs carry no graph and the parameters inside "
       "get no gradient", false},
      {"marked as ready twice", &Cause::kHookCount, kReadyTwice, false},
      {"mark a variable ready only once", &Cause::kHookCount, kReadyTwice, false},
      {"Expected to have finished reduction", &Cause::kHookCount,
       "DistributedDataParallel's reducer did not finish the step: some parameters' gradient hooks never fired "
       "(no gradient reached them through the checkpoint), so DDP waits for them", false},
      {"have different metadata than during the forward pass", nullptr,
       "the recompute saved tensors other than the forward's (PyTorch's CheckpointError)", true},
      {"trying to save more tensors during recomputation than during the original forward", &Cause::kStateful,
       "the recompute took another path than the forward and saved more tensors (PyTorch's CheckpointError): "
       "state the forward changed, or a decision that depends on it", true},
      {"A different number of tensors was saved during the original forward and recomputation", &Cause::kStateful,
       "the recompute took another path than the forward and saved another number of tensors (PyTorch's "
       "CheckpointError): state the forward changed, or a decision that depends on it", true},
  };
  for (const auto& row : rows) {
    if (error.find(row.fragment) == std::string::npos) continue;
    return PytorchErrorMeaning{row.cause ? *row.cause : metadata_cause(error), row.evidence, row.checkpoint_error};
  }
  return std::nullopt;
}

std::optional<CheckResult> plain_not_repeatable(const std::string& id, const CheckContext& ctx) {
  const auto& names = ctx.records.plain_not_repeated;
  if (!names || names->empty()) return std::nullopt;
  CheckResult r;
  r.id = id;
  r.status = Status::kError;
  const std::string why =
      ctx.records.compiled
          ? "compiled kernels that add in parallel (on the CPU, inductor's embedding backward adds across threads), "
            "or state ckcheck cannot see; compare within a --tolerance (rtol=1e-4,atol=1e-6)"
          : ctx.tolerance.automatic()
              ? "random numbers drawn outside the seeded generators, or state ckcheck cannot see (declare it: "
                "Model::extra_state, a buffer or an attribute)"
              : "state ckcheck cannot see (declare it: Model::extra_state, a buffer or an attribute) or a "
                "non-deterministic op outside the checkpointed sites; for reductions that regroup from run to run, "
                "--tolerance auto judges the checkpointed step against the plain step's own noise";
  r.summary = fmt::format(
      "two plain steps from the same restored state already differ ({} tensors, first {}){}: the step is not "
      "repeatable without checkpointing, so checkpointing cannot be judged -- {}",
      names->size(), names->front(), ctx.tolerance.automatic() ? ", beyond rounding" : "", why);
  r.details["plain_not_repeated"] = *names;
  return r;
}

CheckResult checkpointed_failed(const std::string& id, const CheckContext& ctx, const std::string& message_prefix,
                                const std::string& summary) {
  const auto& error = ctx.records.checkpointed.error;
  const auto explained = explain_sites(ctx);
  CheckResult r;
  r.id = id;
  // PyTorch's reentrant checkpoint refuses autograd.grad() and backward(inputs=) (ckcheck's own
  // checkpoint and the non-reentrant one give plain autograd's result).
  const bool grad_api = error.find("torch.utils.checkpoint is incompatible with .grad()") != std::string::npos;
  // PyTorch's message says what went wrong where ckcheck's evidence is silent; for a CheckpointError
  // it also says more than state evidence (state changed before the recompute) or no evidence.
  auto meaning = grad_api ? std::nullopt : pytorch_error_meaning(error);
  if (meaning && meaning->cause == Cause::kAutocast) meaning->cause = dtype_cause(ctx);
  if (meaning && !explained.empty()) {
    const auto& by_evidence = explained.front().cause;
    const bool vaguer = by_evidence == Cause::kInPlace || by_evidence == Cause::kUnexplained;
    if (!(meaning->checkpoint_error && vaguer)) meaning.reset();
  }
  if (!grad_api && explained.empty() && !meaning) {
    // Nothing the checks saw explains it: an error, not a finding with a guessed cause.
    auto site = text_after(error, "ckcheck::checkpoint(", ")");
    // The message may not name it; the evidence does: the call whose recompute threw.
    for (const auto& c : ctx.records.checkpointed.calls) {
      const bool forward_threw = !c.versions_entry.empty() && c.versions_exit.empty();
      if (site.empty() && (c.recompute_failed || forward_threw)) site = c.site;
    }
    r.status = Status::kError;
    r.summary = fmt::format("the checkpointed step threw{}: {}", site.empty() ? "" : " at " + site, first_line(error));
    r.details["error"] = first_line(error);
    if (!site.empty()) r.details["site"] = site;
    return r;
  }
  Finding f;
  f.message = message_prefix + first_line(error);
  if (grad_api) {
    f.cause = Cause::kGradApi;
    f.site = site_of_pytorch_error(ctx, f.cause);
  } else if (meaning) {
    f.cause = meaning->cause;
    f.site = explained.empty() ? site_of_pytorch_error(ctx, f.cause) : explained.front().site;
    f.message += "; " + meaning->evidence;
  } else {
    const auto& e = explained.front();
    f.cause = e.cause;
    f.site = e.site;
    f.hint = e.hint;
    if (!e.evidence.empty()) f.message += "; " + e.evidence;
  }
  add_finding(r, f);
  r.status = Status::kFail;
  r.summary = summary;
  return r;
}

}  // namespace ckcheck
