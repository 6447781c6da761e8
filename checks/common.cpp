#include "checks/common.h"

#include "checks/evidence.h"

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

CheckResult checkpointed_failed(const std::string& id, const CheckContext& ctx, const std::string& message_prefix,
                                const std::string& summary) {
  const auto explained = explain_sites(ctx);
  CheckResult r;
  r.id = id;
  Finding f;
  f.cause = explained.empty() ? Cause::kNonDeterministic : explained.front().cause;
  f.site = explained.empty() ? "" : explained.front().site;
  const auto& error = ctx.records.checkpointed.error;
  // ckcheck::checkpoint's own refusal of grad()/backward(inputs=)/create_graph names its site.
  const std::string refused = "ckcheck::checkpoint(";
  if (error.find("are not supported through a checkpoint") != std::string::npos ||
      error.find("double backward (create_graph=true) is not supported") != std::string::npos) {
    f.cause = Cause::kGradApi;
    const auto at = error.find(refused);
    if (at != std::string::npos) {
      const auto begin = at + refused.size();
      f.site = error.substr(begin, error.find(')', begin) - begin);
    }
  }
  f.message = message_prefix + error;
  add_finding(r, f);
  r.status = Status::kFail;
  r.summary = summary;
  return r;
}

}  // namespace ckcheck
