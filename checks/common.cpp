#include "checks/common.h"

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

CheckResult reference_failed(const std::string& id, const CheckContext& ctx) {
  CheckResult r;
  r.id = id;
  r.status = Status::kError;
  r.summary = "the plain (reference) step failed, so there is nothing to compare: " +
              ctx.records.reference.error;
  return r;
}

namespace {

// The site a ckcheck::checkpoint error names ("ckcheck::checkpoint(blocks.1): ..."), or "".
std::string site_in_error(const std::string& error) {
  const std::string key = "ckcheck::checkpoint(";
  const auto at = error.find(key);
  if (at == std::string::npos) return "";
  const auto begin = at + key.size();
  const auto end = error.find(')', begin);
  return end == std::string::npos ? "" : error.substr(begin, end - begin);
}

}  // namespace

std::optional<CheckResult> plain_not_repeatable(const std::string& id, const CheckContext& ctx) {
  const auto& names = ctx.records.plain_not_repeated;
  if (!names || names->empty()) return std::nullopt;
  CheckResult r;
  r.id = id;
  r.status = Status::kError;
  r.summary = fmt::format(
      "two plain steps from the same restored state already differ ({} tensors, first {}): the step is not repeatable "
      "without checkpointing, so checkpointing cannot be judged -- state ckcheck cannot see (declare it: "
      "Model::extra_state, a buffer or an attribute) or a non-deterministic op outside the checkpointed sites",
      names->size(), names->front());
  r.details["plain_not_repeated"] = *names;
  return r;
}

CheckResult checkpointed_failed(const std::string& id, const CheckContext& ctx, const std::string& message_prefix,
                                const std::string& summary) {
  const auto& error = ctx.records.checkpointed.error;
  const auto explained = explain_sites(ctx);
  CheckResult r;
  r.id = id;
  const bool grad_api = error.find("are not supported through a checkpoint") != std::string::npos ||
                        error.find("double backward (create_graph=true) is not supported") != std::string::npos;
  if (!grad_api && explained.empty()) {
    // Nothing the checks saw explains it: an error, not a finding with a guessed cause.
    auto site = site_in_error(error);
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
  // ckcheck::checkpoint's own refusal of grad()/backward(inputs=)/create_graph names its site.
  f.cause = grad_api ? Cause::kGradApi : explained.front().cause;
  f.site = grad_api ? site_in_error(error) : explained.front().site;
  f.message = message_prefix + first_line(error);
  add_finding(r, f);
  r.status = Status::kFail;
  r.summary = summary;
  return r;
}

}  // namespace ckcheck
