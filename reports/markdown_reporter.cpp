// Markdown: a summary for a CI job page (GitHub's step summary, a GitLab MR note).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "harness/support/text.h"
#include "reports/report.h"
#include "reports/sections.h"

namespace ckcheck {
namespace {

// Text from the model (names, messages) in a Markdown table or list: no cell break, no HTML (a
// Markdown page renders HTML: '<img onerror=...>' in a module name must stay text), no control
// characters.
std::string md_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '|': out += "\\|"; break;
      case '\n': out += " "; break;
      case '<': out += "&lt;"; break;  // no tag can open ('>' alone is text)
      case '&': out += "&amp;"; break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 && c != 0x7f) out += c;
    }
  }
  return out;
}

// ... and inside a code span, where HTML is text already: no backtick to end the span early.
std::string md_code(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '`') {
      out += "'";
    } else if (static_cast<unsigned char>(c) >= 0x20 && c != 0x7f) {
      out += c;
    }
  }
  return out;
}

// A code block: no line that closes it early, no control characters.
std::string md_block(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x20 || c == '\n') out += c == '`' ? '\'' : c;
  }
  return out;
}

// A command, verbatim, in a sh block whose fence is longer than any run of backticks in it (its
// control characters are already shell escapes: shell_quote): copied, it runs as written.
std::string md_command(const std::string& command) {
  size_t longest = 0, run = 0;
  for (char c : command) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  const std::string fence(std::max<size_t>(3, longest + 1), '`');
  return fmt::format("{}sh\n{}\n{}\n", fence, visible(command), fence);
}

class MarkdownReporter : public Reporter {
 private:
  static void bench(const BenchResult& b, std::ostream& out) {
    out << "### Memory and time per policy\n\n" << bench_header(b) << ".\n\n";
    if (!b.offload.empty()) out << "Offload " << md_escape(b.offload) << ": " << md_escape(b.offload_note) << ".\n\n";
    if (b.parallel) {
      out << "Parallel " << parallel_kind_name(*b.parallel) << ", " << b.world_size << " ranks: " << md_escape(b.parallel_note) << ".\n\n";
    }
    out << "| policy | checkpointed | peak above baseline | x none | analytic | step time median [min..max] | x none | checks | note |\n";
    out << "|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& row : bench_rows(b)) {
      out << fmt::format("| `{}` | {} | {} | {} | {} | {} | {} | {} | {} |\n", md_code(row.policy), md_escape(row.units),
                         row.peak, row.peak_ratio, row.analytic, row.time, row.time_ratio, row.checks, md_escape(row.note));
    }
    out << "\n**Recommendation:** " << recommendation_text(b, "`", "`") << ".\n\n";
    for (const auto& w : b.warnings) out << "- warning: " << md_escape(w) << "\n";
    if (!b.warnings.empty()) out << "\n";
  }

  static void plan(const MemoryPlan& p, const std::string& run_command, std::ostream& out) {
    out << "### Memory plan\n\n" << md_escape(plan_header(p)) << ".\n\n";
    out << "| site | input | a checkpoint frees | adds in its backward | adds time |\n|---|---|---|---|---|\n";
    for (const auto& row : plan_site_rows(p)) {
      out << fmt::format("| `{}` | {} | {} | {} | {} |\n", md_code(row.site), row.input, row.kept, row.extra, row.recompute);
    }
    if (const auto note = plan_profile_note(p); !note.empty()) out << "\nProfile: " << md_escape(note) << ".\n";
    if (const auto rows = plan_op_class_rows(p); !rows.empty()) {
      out << "\n| op class (selective plans) | calls | saving it keeps | saving it spares |\n|---|---|---|---|\n";
      for (const auto& row : rows) out << fmt::format("| `{}` | {} | {} | {} |\n", md_code(row.op), row.calls, row.keeps, row.spares);
    }
    if (const auto note = plan_op_class_note(p); !note.empty()) out << "\nOp classes: " << md_escape(note) << ".\n";
    out << "\nSolver: " << md_escape(p.solver)
        << fmt::format(" ({} pairs kept in all, at most {} after one site{}).\n\n", p.stats.states, p.stats.largest_front,
                       p.sac_subsets > 0 ? fmt::format("; {} op-class subsets weighed", p.sac_subsets) : "");
    out << "| plan | checkpointed | predicted peak | measured peak | error | time x none predicted | measured [95%] | checks | outcome |\n";
    out << "|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& row : plan_rows(p)) {
      out << fmt::format("| `{}` | {} | {} | {} | {} | {} | {} | {} | {} |\n", md_code(row.policy), row.units, row.predicted_peak,
                         row.measured_peak, row.peak_error, row.predicted_time, row.measured_time, row.checks, md_escape(row.outcome));
    }
    out << "\n**Recommendation:** " << md_escape(plan_recommendation_text(p, "", "")) << ".\n\n";
    if (!run_command.empty()) out << "Run it: `" << md_code(run_command) << "`\n\n";
    for (const auto& w : p.measured.warnings) out << "- warning: " << md_escape(w) << "\n";
    if (!p.measured.warnings.empty()) out << "\n";
  }

  // The checks, then each finding with its fix.
  static void checks_table(const Report& r, std::ostream& out) {
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
                               f.site.empty() ? std::string() : fmt::format("`{}` ", md_code(f.site)),
                               f.tensor.empty() ? std::string() : fmt::format("({}) ", md_escape(f.tensor)),
                               cause_name(f.cause), md_escape(f.message), md_escape(f.hint));
          }
        }
        out << "\n";
      }
    }
  }

  // The worst differing tensors, or that all are equal.
  static void tensors_table(const Report& r, std::ostream& out) {
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
        out << fmt::format("| `{}` | {} | {} | {} | {} | {} | {} |\n", md_code(d.name), d.kind, d.step,
                           format_number(d.max_abs), format_number(d.max_rel), d.max_ulp,
                           d.missing != "none" ? "missing: " + d.missing : fmt::format("{}/{}", d.mismatched, d.numel));
      }
      out << "\n";
    } else if (!r.tensors.empty()) {
      out << fmt::format("All {} compared tensors are equal.\n\n", r.tensors.size());
    }
  }

 public:
  void write(const Report& r, std::ostream& out) override {
    const char* mark = r.verdict == Verdict::kPass ? "PASS" : r.verdict == Verdict::kFail ? "FAIL" : "ERROR";
    out << fmt::format("## ckcheck {}: {} — `{}`\n\n", r.command, mark, md_code(r.model.name));
    if (!r.model.policy.empty()) {
      std::vector<std::string> units;
      for (const auto& u : r.model.units) units.push_back(md_code(u));
      out << fmt::format("Policy `{}`, checkpointed: {}", md_code(r.model.policy),
                         units.empty() ? std::string("nothing") : fmt::format("`{}`", fmt::join(units, "`, `")));
      if (r.config.contains("tolerance")) out << fmt::format(", tolerance `{}`", r.config["tolerance"].get<std::string>());
      out << ".\n\n";
    }
    checks_table(r, out);
    tensors_table(r, out);
    if (r.validation) {
      out << "### Custom op\n\n";
      for (const auto& line : validation_lines(*r.validation)) out << "- " << md_escape(line) << "\n";
      out << "\n";
    }
    if (r.diagnosis) {
      out << "### Diagnosis\n\n```\n";
      for (const auto& line : diagnosis_lines(*r.diagnosis)) out << md_block(line) << "\n";
      out << "```\n\n";
    }
    if (r.bench) bench(*r.bench, out);
    if (r.plan) plan(*r.plan, r.plan_command, out);
    if (r.selftest) {
      out << "### Selftest\n\n```\n";
      for (const auto& line : selftest_lines(*r.selftest)) out << md_block(line) << "\n";
      out << "```\n\n";
    }
    if (!r.reproduce.empty()) out << "Reproduce:\n\n" << md_command(r.reproduce);
  }
};

}  // namespace

std::unique_ptr<Reporter> make_markdown_reporter() { return std::make_unique<MarkdownReporter>(); }

}  // namespace ckcheck
