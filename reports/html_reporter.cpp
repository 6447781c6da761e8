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

class HtmlReporter : public Reporter {
 public:
  void write(const Report& r, std::ostream& out) override {
    out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
    out << fmt::format("<title>ckcheck {} {}: {}</title>\n", r.command, escape_markup(r.model.name), r.verdict);
    out << "<style>" << kStyle << "</style></head><body>\n";
    out << fmt::format("<h1>ckcheck {} &middot; <code>{}</code> &middot; <span class=\"{}\">{}</span></h1>\n",
                       r.command, escape_markup(r.model.name), r.verdict, r.verdict);
    if (!r.model.policy.empty()) {
      out << fmt::format("<p>Policy <code>{}</code>; checkpointed: {}.</p>\n", escape_markup(r.model.policy),
                         r.model.units.empty() ? std::string("nothing")
                                               : escape_markup(fmt::format("{}", fmt::join(r.model.units, ", "))));
    }
    if (!r.checks.empty()) {
      out << "<h2>Checks</h2>\n<table><tr><th>check</th><th>status</th><th>summary and findings</th></tr>\n";
      for (const auto& c : r.checks) {
        out << fmt::format("<tr><td><code>{}</code></td><td class=\"{}\">{}</td><td>{}", c.id,
                           status_name(c.status), status_name(c.status), escape_markup(c.summary));
        if (!c.findings.empty()) {
          out << "<ul>";
          for (const auto& f : c.findings) {
            out << fmt::format("<li><code>{}</code> {}{}{}<br><span class=\"hint\">fix: {}</span></li>",
                               cause_name(f.cause), f.site.empty() ? "" : "<code>" + escape_markup(f.site) + "</code> ",
                               f.tensor.empty() ? "" : "(" + escape_markup(f.tensor) + ") ",
                               escape_markup(f.message), escape_markup(f.hint));
          }
          out << "</ul>";
        }
        out << "</td></tr>\n";
      }
      out << "</table>\n";
    }
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
    out << html_sections(r);
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
