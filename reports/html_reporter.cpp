// HTML: one self-contained page (inline CSS and SVG, no scripts, no server) that opens in any
// browser.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "reports/report.h"
#include "reports/sections.h"

namespace ckcheck {
namespace {

const char* kStyle = R"(body{font-family:system-ui,sans-serif;margin:2rem;max-width:72rem;color:#222}
h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:2rem}table{border-collapse:collapse;margin:.5rem 0}
td,th{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f3f3}.pass{color:#176b2c}.fail{color:#b00020;font-weight:bold}.warn{color:#8a6100}
.skip{color:#777}.error{color:#7b1fa2;font-weight:bold}code{background:#f5f5f5;padding:0 .2rem}
.hint{color:#555;font-style:italic}.num{text-align:right;font-variant-numeric:tabular-nums})";

// A row of a table of policies (bench's, plan's): the policy, its figures, the verdict of its
// checks (coloured by it) and a note.
std::string policy_row(const std::string& policy, const std::vector<std::string>& figures, const std::string& checks,
                       const std::string& note) {
  std::string row = fmt::format("<tr><td><code>{}</code></td>", escape_markup(policy));
  for (const auto& f : figures) row += fmt::format("<td class=\"num\">{}</td>", f);
  return row + fmt::format("<td class=\"{}\">{}</td><td>{}</td></tr>\n", checks == "-" ? "skip" : checks, checks,
                           escape_markup(note));
}

class HtmlReporter : public Reporter {
 private:
  static void plan(const MemoryPlan& p, const std::string& run_command, std::ostream& out) {
    out << "<h2>Memory plan</h2>\n<p>" << escape_markup(plan_header(p)) << ".</p>\n";
    out << bench_svg(p.measured);
    out << "<table><tr><th>site</th><th>input</th><th>a checkpoint frees</th><th>adds in its backward</th><th>adds time</th></tr>\n";
    for (const auto& row : plan_site_rows(p)) {
      out << fmt::format("<tr><td><code>{}</code></td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
                         "<td class=\"num\">{}</td></tr>\n",
                         escape_markup(row.site), row.input, row.kept, row.extra, row.recompute);
    }
    out << "</table>\n";
    if (const auto note = plan_profile_note(p); !note.empty()) out << "<p>Profile: " << escape_markup(note) << ".</p>\n";
    if (const auto rows = plan_op_class_rows(p); !rows.empty()) {
      out << "<table><tr><th>op class (selective plans)</th><th>calls</th><th>saving it keeps</th><th>saving it spares</th></tr>\n";
      for (const auto& row : rows) {
        out << fmt::format("<tr><td><code>{}</code></td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>\n",
                           escape_markup(row.op), row.calls, row.keeps, row.spares);
      }
      out << "</table>\n";
    }
    if (const auto note = plan_op_class_note(p); !note.empty()) out << "<p>Op classes: " << escape_markup(note) << ".</p>\n";
    out << "<p>Solver: " << escape_markup(p.solver)
        << fmt::format(" ({} pairs kept in all, at most {} after one site{}).</p>\n", p.stats.states, p.stats.largest_front,
                       p.sac_subsets > 0 ? fmt::format("; {} op-class subsets weighed", p.sac_subsets) : "");
    out << "<table><tr><th>plan</th><th>checkpointed</th><th>predicted peak</th><th>measured peak</th><th>error</th>"
           "<th>time x none predicted</th><th>measured [95%]</th><th>checks</th><th>outcome</th></tr>\n";
    for (const auto& row : plan_rows(p)) {
      out << policy_row(row.policy,
                        {row.units, row.predicted_peak, row.measured_peak, row.peak_error, row.predicted_time,
                         row.measured_time},
                        row.checks, row.outcome);
    }
    out << "</table>\n";
    out << "<p><b>Recommendation:</b> " << escape_markup(plan_recommendation_text(p, "", "")) << ".</p>\n";
    if (!run_command.empty()) out << "<p>Run it: <code>" << escape_markup(run_command) << "</code></p>\n";
    if (!p.measured.warnings.empty()) {
      out << "<ul>";
      for (const auto& w : p.measured.warnings) out << "<li class=\"warn\">" << escape_markup(w) << "</li>";
      out << "</ul>\n";
    }
  }

  static void bench(const BenchResult& b, std::ostream& out) {
    out << "<h2>Memory and time per policy</h2>\n<p>" << escape_markup(bench_header(b)) << ".</p>\n";
    if (!b.offload.empty()) out << "<p>Offload " << escape_markup(b.offload) << ": " << escape_markup(b.offload_note) << ".</p>\n";
    if (b.parallel) {
      out << "<p>Parallel " << parallel_kind_name(*b.parallel) << ", " << b.world_size << " ranks: " << escape_markup(b.parallel_note)
          << ".</p>\n";
    }
    out << bench_svg(b);
    out << "<table><tr><th>policy</th><th>checkpointed</th><th>peak above baseline</th><th>x none</th><th>analytic</th>"
           "<th>step time median [min..max]</th><th>x none</th><th>checks</th><th>note</th></tr>\n";
    for (const auto& row : bench_rows(b)) {
      out << policy_row(row.policy, {row.units, row.peak, row.peak_ratio, row.analytic, row.time, row.time_ratio},
                        row.checks, row.note);
    }
    out << "</table>\n";
    out << fmt::format("<p><b>Recommendation:</b> {} ({}).</p>\n",
                       b.recommendation.empty() ? "no policy" : "<code>" + escape_markup(b.recommendation) + "</code>",
                       escape_markup(b.reason));
    if (!b.warnings.empty()) {
      out << "<ul>";
      for (const auto& w : b.warnings) out << "<li class=\"warn\">" << escape_markup(w) << "</li>";
      out << "</ul>\n";
    }
  }

  // The checks, each with its findings and fixes.
  static void checks_table(const Report& r, std::ostream& out) {
    if (!r.checks.empty()) {
      out << "<h2>Checks</h2>\n<table><tr><th>check</th><th>status</th><th>summary and findings</th></tr>\n";
      for (const auto& c : r.checks) {
        out << fmt::format("<tr><td><code>{}</code></td><td class=\"{}\">{}</td><td>{}", c.id,
                           status_name(c.status), status_name(c.status), escape_markup(c.summary));
        if (!c.findings.empty()) {
          out << "<ul>";
          for (const auto& f : c.findings) {
            out << fmt::format("<li><code>{}</code> {}{}{}<br><span class=\"hint\">fix: {}</span></li>",
                               cause_name(f.cause),
                               f.site.empty() ? std::string() : fmt::format("<code>{}</code> ", escape_markup(f.site)),
                               f.tensor.empty() ? std::string() : fmt::format("({}) ", escape_markup(f.tensor)),
                               escape_markup(f.message), escape_markup(f.hint));
          }
          out << "</ul>";
        }
        out << "</td></tr>\n";
      }
      out << "</table>\n";
    }
  }

  // Every compared tensor.
  static void tensors_table(const Report& r, std::ostream& out) {
    size_t bad = 0;
    for (const auto& d : r.tensors) bad += !d.equal;
    if (!r.tensors.empty()) {
      out << fmt::format("<h2>Tensors ({} of {} differ)</h2>\n", bad, r.tensors.size());
      out << "<table><tr><th>tensor</th><th>kind</th><th>step</th><th>equal</th><th>max abs</th>"
             "<th>max rel</th><th>max ulp</th><th>mismatched</th><th>NaN/Inf ref / ckpt</th></tr>\n";
      for (const auto& d : r.tensors) {
        out << fmt::format("<tr><td><code>{}</code></td><td>{}</td><td class=\"num\">{}</td><td class=\"{}\">{}</td>"
                           "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
                           "<td class=\"num\">{}</td><td class=\"num\">{} / {}</td></tr>\n",
                           escape_markup(d.name), d.kind, d.step, d.equal ? "pass" : "fail",
                           d.equal ? "yes" : "no", format_number(d.max_abs), format_number(d.max_rel),
                           d.max_ulp,
                           d.missing != "none" ? "missing: " + d.missing : fmt::format("{}/{}", d.mismatched, d.numel),
                           d.nonfinite_reference, d.nonfinite_checkpointed);
      }
      out << "</table>\n";
    }
  }

 public:
  void write(const Report& r, std::ostream& out) override {
    out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
    const char* verdict = verdict_name(r.verdict);
    out << fmt::format("<title>ckcheck {} {}: {}</title>\n", r.command, escape_markup(r.model.name), verdict);
    out << "<style>" << kStyle << "</style></head><body>\n";
    out << fmt::format("<h1>ckcheck {} &middot; <code>{}</code> &middot; <span class=\"{}\">{}</span></h1>\n",
                       r.command, escape_markup(r.model.name), verdict, verdict);
    if (!r.model.policy.empty()) {
      out << fmt::format("<p>Policy <code>{}</code>; checkpointed: {}.</p>\n", escape_markup(r.model.policy),
                         r.model.units.empty() ? std::string("nothing")
                                               : escape_markup(fmt::format("{}", fmt::join(r.model.units, ", "))));
    }
    checks_table(r, out);
    tensors_table(r, out);
    if (r.validation) {
      out << "<h2>Custom op</h2>\n<ul>";
      for (const auto& l : validation_lines(*r.validation)) out << "<li>" << escape_markup(l) << "</li>";
      out << "</ul>\n";
    }
    if (r.diagnosis) {
      out << "<h2>Diagnosis</h2>\n<pre>";
      for (const auto& l : diagnosis_lines(*r.diagnosis)) out << escape_markup(l) << "\n";
      out << "</pre>\n";
    }
    if (r.bench) bench(*r.bench, out);
    if (r.plan) plan(*r.plan, r.plan_command, out);
    if (r.selftest) {
      out << "<h2>Selftest</h2>\n<pre>";
      for (const auto& l : selftest_lines(*r.selftest)) out << escape_markup(l) << "\n";
      out << "</pre>\n";
    }
    if (!r.reproduce.empty()) {
      out << fmt::format("<h2>Reproduce</h2>\n<pre style=\"white-space: pre-wrap; overflow-wrap: anywhere\"><code>{}</code></pre>\n",
                         escape_markup(r.reproduce));
    }
    out << fmt::format("<p class=\"skip\">ckcheck {}</p>\n</body></html>\n", ckcheck_version());
  }
};

}  // namespace

std::unique_ptr<Reporter> make_html_reporter() { return std::make_unique<HtmlReporter>(); }

}  // namespace ckcheck
