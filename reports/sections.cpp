#include "reports/sections.h"

#include <fmt/format.h>

#include <cmath>

#include "harness/analyses/bench.h"
#include "harness/support/text.h"

namespace ckcheck {

namespace {

std::string str(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return "";
  return j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
}

std::string op_cell(const nlohmann::json& v) {
  if (v.is_null()) return "(none)";
  return fmt::format("{}{} {} {}{}", std::string(2 * std::min(v.value("depth", 0), 6), ' '), str(v, "name"),
                     str(v, "dtypes"), str(v, "shapes"),
                     str(v, "autocast").empty() || str(v, "autocast") == "off" ? "" : " @" + str(v, "autocast"));
}

std::string nan_text(const nlohmann::json& n) {
  if (n.is_null()) return "none";
  return fmt::format("{} at {} ({}{})", str(n, "op"), str(n, "site").empty() ? "(outside any site)" : str(n, "site"),
                     str(n, "phase"), str(n, "node").empty() ? "" : ", in " + str(n, "node"));
}

// The diagnosis as lines of text (console and, fenced, Markdown).
std::vector<std::string> diagnosis_lines(const nlohmann::json& d) {
  std::vector<std::string> out;
  out.push_back("diagnosis: " + str(d, "summary"));
  if (!d["sites"].empty()) {
    out.push_back(d.value("interaction", false) ? "  sites whose checkpointing changes the result, together:"
                                                : "  sites whose checkpointing changes the result:");
    for (const auto& s : d["sites"]) {
      out.push_back(fmt::format("    {}  {}: {}", str(s, "site"), str(s, "cause"), str(s, "evidence")));
      out.push_back(fmt::format("    {}  fix: {}", std::string(str(s, "site").size(), ' '), str(s, "hint")));
    }
  }
  const auto& od = d["first_divergent_op"];
  if (!od.is_null()) {
    if (od.value("index", -1) < 0) {
      out.push_back(fmt::format("  op diff of {}: {}", str(od, "site"), str(od, "note")));
    } else {
      const auto name = od["forward"].is_null() ? str(od["recompute"], "name") : str(od["forward"], "name");
      std::string what = str(od, "what");
      if (what == "values") what = fmt::format("values differ (max abs {})", od.value("max_abs", 0.0));
      else if (what == "count") what = fmt::format("the forward ran {} ops, the recompute {}", od.value("forward_ops", 0), od.value("recompute_ops", 0));
      else if (what == "error") what = str(od, "note");
      else what += " differs";
      out.push_back(fmt::format("  first divergent op: {} (op {} of {}): {}{}", name, od.value("index", -1),
                                str(od, "site"), what, str(od, "innermost").empty() ? "" : "; inside it, " + str(od, "innermost")));
      out.push_back(fmt::format("      {:>4}  {:<46} {}", "op", "forward", "recompute"));
      for (const auto& row : od["context"]) {
        const auto& f = row["forward"];
        const auto& r = row["recompute"];
        const int idx = f.is_null() ? r.value("index", -1) : f.value("index", -1);
        out.push_back(fmt::format("    {} {:>4}  {:<46} {}", row.value("same", true) ? " " : ">", idx, op_cell(f), op_cell(r)));
      }
    }
  }
  const auto& n = d["nan_origin"];
  if (!n["reference"].is_null() || !n["checkpointed"].is_null()) {
    out.push_back(fmt::format("  NaN/Inf origin without checkpointing: {}", nan_text(n["reference"])));
    out.push_back(fmt::format("  NaN/Inf origin with checkpointing:    {}{}", nan_text(n["checkpointed"]),
                              n.value("without_checkpointing", false) ? " (it exists without checkpointing too)"
                                                                      : " (checkpointing introduced it)"));
  }
  return out;
}

std::string bytes_text(const nlohmann::json& v) { return v.is_null() ? "-" : format_bytes(v.get<double>()); }

std::string seconds_text(double s) {
  if (s >= 1) return fmt::format("{:.2f} s", s);
  if (s >= 1e-3) return fmt::format("{:.1f} ms", s * 1e3);
  return fmt::format("{:.0f} us", s * 1e6);
}

struct BenchRow {
  std::string policy, units, peak, peak_ratio, analytic, time, time_ratio, note;
};

std::vector<BenchRow> bench_rows(const Report& r) {
  std::vector<BenchRow> rows;
  for (const auto& p : r.sections["policies"]) {
    BenchRow row;
    row.policy = p.value("policy", "");
    row.units = std::to_string(p["checkpointed"].size());
    row.note = p.value("note", "");
    if (p["time_median_s"].is_null()) {
      row.peak = row.peak_ratio = row.analytic = row.time = row.time_ratio = "-";
    } else {
      row.peak = bytes_text(p["peak_bytes"]);
      row.peak_ratio = p.contains("peak_ratio") ? fmt::format("{:.2f}", p["peak_ratio"].get<double>()) : "-";
      row.analytic = bytes_text(p["analytic_bytes"]);
      row.time = fmt::format("{} [{}..{}]", seconds_text(p["time_median_s"].get<double>()),
                             seconds_text(p["time_min_s"].get<double>()), seconds_text(p["time_max_s"].get<double>()));
      row.time_ratio = !p.contains("time_ratio") ? "-"
                       : p.contains("time_ratio_low")
                           ? fmt::format("{:.2f} [{:.2f}, {:.2f}]", p["time_ratio"].get<double>(), p["time_ratio_low"].get<double>(),
                                         p["time_ratio_high"].get<double>())
                           : fmt::format("{:.2f}", p["time_ratio"].get<double>());
      if (!p.value("fits", true)) row.note = row.note.empty() ? "does not fit" : "does not fit: " + row.note;
    }
    rows.push_back(row);
  }
  return rows;
}

std::string bench_header(const Report& r) {
  const auto& s = r.sections;
  return fmt::format("device {}, baseline {} (parameters {}, gradients {}; Adam's moments would add {}); {} rounds, "
                     "policies interleaved; time x none: ratio of the means of the fastest 30% of steps, with its 95% interval; {}",
                     str(s, "device"), bytes_text(s["baseline_bytes"]), bytes_text(s["parameter_bytes"]),
                     bytes_text(s["gradient_bytes"]), bytes_text(s["adam_state_bytes"]), s.value("rounds", 0), str(s, "clock"));
}

std::vector<std::string> bench_lines(const Report& r) {
  std::vector<std::string> out;
  out.push_back("bench: " + bench_header(r));
  out.push_back(fmt::format("  {:<16} {:>5} {:>12} {:>7} {:>12} {:<30} {:<18}  {}", "policy", "ckpt", "peak", "x none",
                            "analytic", "step time median [min..max]", "x none [95%]", ""));
  for (const auto& row : bench_rows(r)) {
    out.push_back(fmt::format("  {:<16} {:>5} {:>12} {:>7} {:>12} {:<30} {:<18}  {}", row.policy, row.units, row.peak,
                              row.peak_ratio, row.analytic, row.time, row.time_ratio, row.note));
  }
  const auto& rec = r.sections["recommendation"];
  out.push_back(fmt::format("recommendation: {} ({})", rec.is_null() ? "none" : rec.get<std::string>(),
                            str(r.sections, "recommendation_reason")));
  for (const auto& w : r.sections["warnings"]) out.push_back("warning: " + w.get<std::string>());
  if (!str(r.sections, "analytic_formula").empty()) out.push_back("analytic: " + str(r.sections, "analytic_formula"));
  return out;
}

// Memory against time per policy, as an SVG scatter chart with min..max time bars.
std::string bench_svg(const Report& r) {
  struct Point {
    std::string label;
    double t, tmin, tmax, mem;
    bool fits;
  };
  std::vector<Point> pts;
  const double base = r.sections["baseline_bytes"].is_null() ? 0 : r.sections["baseline_bytes"].get<double>();
  for (const auto& p : r.sections["policies"]) {
    if (p["time_median_s"].is_null()) continue;
    pts.push_back({p.value("policy", ""), p["time_median_s"].get<double>() * 1e3, p["time_min_s"].get<double>() * 1e3,
                   p["time_max_s"].get<double>() * 1e3, (base + p["peak_bytes"].get<double>()) / 1048576.0,
                   p.value("fits", true)});
  }
  if (pts.empty()) return "";
  double tmax = 0, mmax = 0;
  for (const auto& p : pts) {
    tmax = std::max(tmax, p.tmax);
    mmax = std::max(mmax, p.mem);
  }
  const auto& budget = r.sections["memory_budget_bytes"];
  if (!budget.is_null()) mmax = std::max(mmax, budget.get<double>() / 1048576.0);
  tmax *= 1.1;
  mmax *= 1.15;
  // Axis labels in human units: ms or s, MiB or GiB.
  const bool in_s = tmax >= 2000, in_gib = mmax >= 2048;
  const double t_unit = in_s ? 1000.0 : 1.0, m_unit = in_gib ? 1024.0 : 1.0;
  const double W = 720, H = 420, L = 70, R = 20, T = 20, B = 50;
  auto x = [&](double t) { return L + (W - L - R) * t / tmax; };
  auto y = [&](double m) { return H - B - (H - T - B) * m / mmax; };
  std::string svg = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H, W, H);
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#444\"/>\n", L, H - B, W - R, H - B);
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#444\"/>\n", L, T, L, H - B);
  for (int i = 0; i <= 5; ++i) {
    const double tv = tmax * i / 5, mv = mmax * i / 5;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#444\">{:.3g}</text>\n", x(tv), H - B + 16, tv / t_unit);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#444\">{:.3g}</text>\n", L - 6, y(mv) + 4, mv / m_unit);
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eee\"/>\n", L + 1, y(mv), W - R, y(mv));
  }
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step time, {} (median; bar: min..max)</text>\n", (L + W - R) / 2, H - 10, in_s ? "s" : "ms");
  svg += fmt::format("<text x=\"16\" y=\"{:.1f}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1f})\">peak memory, {} (baseline + step)</text>\n", (T + H - B) / 2, (T + H - B) / 2, in_gib ? "GiB" : "MiB");
  if (!budget.is_null()) {
    const double by = y(budget.get<double>() / 1048576.0);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#b00020\" stroke-dasharray=\"6 4\"/>\n", L, by, W - R, by);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#b00020\">memory budget</text>\n", W - R, by - 4);
  }
  const auto& rec = r.sections["recommendation"];
  for (const auto& p : pts) {
    const bool chosen = !rec.is_null() && rec.get<std::string>() == p.label;
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#888\"/>\n", x(p.tmin), y(p.mem), x(p.tmax), y(p.mem));
    svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\"><title>{}: {:.3g} ms, {:.3g} MiB</title></circle>\n",
                       x(p.t), y(p.mem), chosen ? 7 : 5, chosen ? "#176b2c" : (p.fits ? "#1f5fa8" : "#b00020"),
                       escape_markup(p.label), p.t, p.mem);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\"{}>{}</text>\n", x(p.t) + 8, y(p.mem) - 6,
                       chosen ? " font-weight=\"bold\"" : "", escape_markup(p.label));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace

std::vector<std::string> validation_lines(const nlohmann::json& v) {
  std::vector<std::string> out;
  std::string causes;
  for (const auto& c : v["causes"]) causes += (causes.empty() ? "" : ", ") + c.get<std::string>();
  out.push_back(fmt::format("op {}: {}{} ({} cases)", str(v, "op"), str(v, "verdict") == "safe" ? "SAFE to recompute" : "UNSAFE to recompute",
                            causes.empty() ? "" : " -- " + causes, v.value("cases", 0)));
  out.push_back("  schema: " + str(v, "schema"));
  for (const auto& n : v["notes"]) out.push_back("  note: " + n.get<std::string>());
  return out;
}

std::vector<std::string> console_sections(const Report& r) {
  std::vector<std::string> out;
  if (r.sections.contains("validation")) {
    for (auto& l : validation_lines(r.sections["validation"])) out.push_back(std::move(l));
  }
  if (r.sections.contains("diagnosis")) {
    for (auto& l : diagnosis_lines(r.sections["diagnosis"])) out.push_back(std::move(l));
  }
  if (r.sections.contains("policies")) {
    for (auto& l : bench_lines(r)) out.push_back(std::move(l));
  }
  return out;
}

std::vector<std::string> markdown_sections(const Report& r) {
  std::vector<std::string> out;
  if (r.sections.contains("validation")) {
    out.push_back("### Custom op\n");
    for (auto& l : validation_lines(r.sections["validation"])) out.push_back("- " + l);
    out.push_back("");
  }
  if (r.sections.contains("diagnosis")) {
    out.push_back("### Diagnosis\n");
    out.push_back("```");
    for (auto& l : diagnosis_lines(r.sections["diagnosis"])) out.push_back(std::move(l));
    out.push_back("```\n");
  }
  if (r.sections.contains("policies")) {
    out.push_back("### Memory and time per policy\n");
    out.push_back(bench_header(r) + ".\n");
    out.push_back("| policy | checkpointed | peak above baseline | x none | analytic | step time median [min..max] | x none | note |");
    out.push_back("|---|---|---|---|---|---|---|---|");
    for (const auto& row : bench_rows(r)) {
      out.push_back(fmt::format("| `{}` | {} | {} | {} | {} | {} | {} | {} |", row.policy, row.units, row.peak,
                                row.peak_ratio, row.analytic, row.time, row.time_ratio, row.note));
    }
    const auto& rec = r.sections["recommendation"];
    out.push_back(fmt::format("\n**Recommendation:** {} ({}).\n", rec.is_null() ? "none" : "`" + rec.get<std::string>() + "`",
                              str(r.sections, "recommendation_reason")));
    for (const auto& w : r.sections["warnings"]) out.push_back("- warning: " + w.get<std::string>());
    if (!r.sections["warnings"].empty()) out.push_back("");
  }
  return out;
}

std::string html_sections(const Report& r) {
  std::string out;
  if (r.sections.contains("validation")) {
    out += "<h2>Custom op</h2>\n<ul>";
    for (const auto& l : validation_lines(r.sections["validation"])) out += "<li>" + escape_markup(l) + "</li>";
    out += "</ul>\n";
  }
  if (r.sections.contains("diagnosis")) {
    out += "<h2>Diagnosis</h2>\n<pre>";
    for (const auto& l : diagnosis_lines(r.sections["diagnosis"])) out += escape_markup(l) + "\n";
    out += "</pre>\n";
  }
  if (r.sections.contains("policies")) {
    out += "<h2>Memory and time per policy</h2>\n<p>" + escape_markup(bench_header(r)) + ".</p>\n";
    out += bench_svg(r);
    out += "<table><tr><th>policy</th><th>checkpointed</th><th>peak above baseline</th><th>x none</th><th>analytic</th>"
           "<th>step time median [min..max]</th><th>x none</th><th>note</th></tr>\n";
    for (const auto& row : bench_rows(r)) {
      out += fmt::format("<tr><td><code>{}</code></td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
                         "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>\n",
                         escape_markup(row.policy), row.units, row.peak, row.peak_ratio, row.analytic, row.time,
                         row.time_ratio, escape_markup(row.note));
    }
    out += "</table>\n";
    const auto& rec = r.sections["recommendation"];
    out += fmt::format("<p><b>Recommendation:</b> {} ({}).</p>\n", rec.is_null() ? "none" : "<code>" + escape_markup(rec.get<std::string>()) + "</code>",
                       escape_markup(str(r.sections, "recommendation_reason")));
    if (!r.sections["warnings"].empty()) {
      out += "<ul>";
      for (const auto& w : r.sections["warnings"]) out += "<li class=\"warn\">" + escape_markup(w.get<std::string>()) + "</li>";
      out += "</ul>\n";
    }
  }
  return out;
}

}  // namespace ckcheck
