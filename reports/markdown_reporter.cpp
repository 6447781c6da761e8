// Markdown: a summary for a CI job page (GitHub's step summary, a GitLab MR note).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "reports/report.h"
#include "reports/sections.h"

namespace ckcheck {
namespace {

std::string md_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n') {
      out += " ";
    } else {
      out += c;
    }
  }
  return out;
}

class MarkdownReporter : public Reporter {
 public:
  void write(const Report& r, std::ostream& out) override {
    const char* mark = r.verdict == "pass" ? "PASS" : r.verdict == "fail" ? "FAIL" : "ERROR";
    out << fmt::format("## ckcheck {}: {} — `{}`\n\n", r.command, mark, r.model.name);
    if (!r.model.policy.empty()) {
      out << fmt::format("Policy `{}`, checkpointed: {}", r.model.policy,
                         r.model.units.empty() ? std::string("nothing")
                                               : fmt::format("`{}`", fmt::join(r.model.units, "`, `")));
      if (r.config.contains("tolerance")) out << fmt::format(", tolerance `{}`", r.config["tolerance"].get<std::string>());
      out << ".\n\n";
    }
    if (!r.checks.empty()) {
      out << "| check | status | summary |\n|---|---|---|\n";
      for (const auto& c : r.checks) {
        out << fmt::format("| `{}` | {} | {} |\n", c.id, status_name(c.status), md_escape(c.summary));
      }
      out << "\n";
      bool any = false;
      for (const auto& c : r.checks) any = any || !c.findings.empty();
      if (any) {
        out << "### Findings\n\n";
        for (const auto& c : r.checks) {
          for (const auto& f : c.findings) {
            out << fmt::format("- **{}** {}{}`{}`: {}  \n  *fix:* {}\n", c.id,
                               f.site.empty() ? "" : "`" + f.site + "` ",
                               f.tensor.empty() ? "" : "(" + md_escape(f.tensor) + ") ",
                               cause_name(f.cause), md_escape(f.message), md_escape(f.hint));
          }
        }
        out << "\n";
      }
    }
    std::vector<const TensorDiff*> bad;
    for (const auto& d : r.tensors) {
      if (!d.equal) bad.push_back(&d);
    }
    if (!bad.empty()) {
      std::stable_sort(bad.begin(), bad.end(), [](auto* a, auto* b) { return a->max_rel > b->max_rel; });
      out << fmt::format("### Differing tensors ({} of {})\n\n", bad.size(), r.tensors.size());
      out << "| tensor | kind | step | max abs | max rel | max ulp | mismatched |\n|---|---|---|---|---|---|---|\n";
      for (size_t i = 0; i < bad.size() && i < 10; ++i) {
        const auto& d = *bad[i];
        out << fmt::format("| `{}` | {} | {} | {} | {} | {} | {} |\n", d.name, d.kind, d.step,
                           format_number(d.max_abs), format_number(d.max_rel), d.max_ulp,
                           d.missing != "none" ? "missing: " + d.missing : fmt::format("{}/{}", d.mismatched, d.numel));
      }
      out << "\n";
    } else if (!r.tensors.empty()) {
      out << fmt::format("All {} compared tensors are equal.\n\n", r.tensors.size());
    }
    for (const auto& line : markdown_sections(r)) out << line << "\n";
    if (!r.reproduce.empty()) out << fmt::format("Reproduce:\n\n```sh\n{}\n```\n", r.reproduce);
  }
};

}  // namespace

std::unique_ptr<Reporter> make_markdown_reporter() { return std::make_unique<MarkdownReporter>(); }

}  // namespace ckcheck
