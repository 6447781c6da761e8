#include "reports/sections.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "harness/support/text.h"

namespace ckcheck {

namespace {

std::string op_cell(const OpView& v) {
  if (v.index < 0) return "(none)";
  return fmt::format("{}{} {} {}{}", std::string(2 * std::min(v.depth, 6), ' '), v.name, v.dtypes, v.shapes,
                     v.autocast.empty() || v.autocast == "off" ? "" : " @" + v.autocast);
}

std::string nan_text(const NanOrigin& n) {
  if (!n.found) return "none";
  return fmt::format("{} at {} ({}{})", n.op, n.site.empty() ? "(outside any site)" : n.site, phase_name(n.phase),
                     n.node.empty() ? "" : ", in " + n.node);
}

// What differs at the first divergent op, in words.
std::string difference_text(const OpDiff& od) {
  switch (od.what) {
    case OpDifference::kValues:
      return fmt::format("values differ (max abs {})", od.max_abs);
    case OpDifference::kCount:
      return fmt::format("the forward ran {} ops, the recompute {}", od.forward_ops, od.recompute_ops);
    case OpDifference::kError:
      return od.note;
    default:
      return std::string(op_difference_name(od.what)) + " differs";
  }
}

void add_op_diff_lines(const OpDiff& od, std::vector<std::string>& out) {
  if (od.index < 0) {
    out.push_back(fmt::format("  op diff of {}: {}", od.site, od.note));
    return;
  }
  const auto& name = od.forward.index < 0 ? od.recompute.name : od.forward.name;
  out.push_back(fmt::format("  first divergent op: {} (op {} of {}): {}{}", name, od.index, od.site, difference_text(od),
                            od.innermost.empty() ? "" : "; inside it, " + od.innermost));
  out.push_back(fmt::format("      {:>4}  {:<46} {}", "op", "forward", "recompute"));
  for (size_t i = 0; i < od.context.size(); ++i) {
    const auto& [f, r] = od.context[i];
    const int64_t idx = f.index < 0 ? r.index : f.index;
    out.push_back(fmt::format("    {} {:>4}  {:<46} {}", od.context_same[i] ? " " : ">", idx, op_cell(f), op_cell(r)));
  }
}

std::string bytes_text(double bytes) { return format_bytes(bytes); }

}  // namespace

std::string seconds_text(double s) {
  if (s >= 1) return fmt::format("{:.2f} s", s);
  if (s >= 1e-3) return fmt::format("{:.1f} ms", s * 1e3);
  return fmt::format("{:.0f} us", s * 1e6);
}

// Memory against time per policy, as an SVG scatter chart with min..max time bars.
std::string bench_svg(const BenchResult& r) {
  struct Point {
    std::string label;
    double t, tmin, tmax, mem;
    bool fits;
  };
  std::vector<Point> pts;
  const double base = static_cast<double>(r.baseline_bytes);
  for (const auto& p : r.policies) {
    if (p.measurement.step_seconds.empty()) continue;
    pts.push_back({p.policy, p.time_median_s * 1e3, p.time_min_s * 1e3, p.time_max_s * 1e3,
                   (base + static_cast<double>(p.measurement.peak_bytes)) / 1048576.0, p.fits});
  }
  if (pts.empty()) return "";
  double tmax = 0, mmax = 0;
  for (const auto& p : pts) {
    tmax = std::max(tmax, p.tmax);
    mmax = std::max(mmax, p.mem);
  }
  const bool budget = r.memory_budget_bytes >= 0;
  if (budget) mmax = std::max(mmax, static_cast<double>(r.memory_budget_bytes) / 1048576.0);
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
  if (budget) {
    const double by = y(static_cast<double>(r.memory_budget_bytes) / 1048576.0);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#b00020\" stroke-dasharray=\"6 4\"/>\n", L, by, W - R, by);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#b00020\">memory budget</text>\n", W - R, by - 4);
  }
  for (const auto& p : pts) {
    const bool chosen = !r.recommendation.empty() && r.recommendation == p.label;
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


std::vector<std::string> diagnosis_lines(const Diagnosis& d) {
  std::vector<std::string> out;
  out.push_back("diagnosis: " + d.summary);
  if (!d.sites.empty()) {
    out.push_back(d.interaction ? "  sites whose checkpointing changes the result, together:"
                                : "  sites whose checkpointing changes the result:");
    for (const auto& s : d.sites) {
      out.push_back(fmt::format("    {}  {}: {}", s.site, cause_name(s.cause), s.evidence));
      out.push_back(fmt::format("    {}  fix: {}", std::string(s.site.size(), ' '), s.hint));
    }
  }
  if (d.op_diff) add_op_diff_lines(*d.op_diff, out);
  if (d.nan_reference.found || d.nan_checkpointed.found) {
    out.push_back(fmt::format("  NaN/Inf origin without checkpointing: {}", nan_text(d.nan_reference)));
    out.push_back(fmt::format("  NaN/Inf origin with checkpointing:    {}{}", nan_text(d.nan_checkpointed),
                              d.nan_reference.found ? " (it exists without checkpointing too)"
                                                    : " (checkpointing introduced it)"));
  }
  return out;
}

std::vector<std::string> validation_lines(const OpValidation& v) {
  std::vector<std::string> out;
  std::string causes;
  for (const auto& c : validation_causes(v)) causes += (causes.empty() ? "" : ", ") + c;
  out.push_back(fmt::format("op {}: {}{} ({} cases)", v.op, v.safe ? "SAFE to recompute" : "UNSAFE to recompute",
                            causes.empty() ? "" : " -- " + causes, v.cases));
  out.push_back("  schema: " + v.schema);
  for (const auto& n : v.notes) out.push_back("  note: " + n);
  return out;
}

std::vector<BenchRow> bench_rows(const BenchResult& r) {
  const PolicyBench* none = measured_none(r);
  std::vector<BenchRow> rows;
  for (const auto& p : r.policies) {
    BenchRow row;
    row.policy = p.policy;
    row.units = std::to_string(p.checkpointed.size());
    row.note = p.note;
    if (p.measurement.step_seconds.empty()) {
      row.peak = row.peak_ratio = row.analytic = row.time = row.time_ratio = "-";
    } else {
      row.peak = bytes_text(static_cast<double>(p.measurement.peak_bytes));
      row.peak_ratio = none ? fmt::format("{:.2f}", peak_ratio(p, *none)) : "-";
      row.analytic = p.analytic_bytes ? bytes_text(*p.analytic_bytes) : "-";
      row.time = fmt::format("{} [{}..{}]", seconds_text(p.time_median_s), seconds_text(p.time_min_s),
                             seconds_text(p.time_max_s));
      row.time_ratio =
          none ? fmt::format("{:.2f} [{:.2f}, {:.2f}]", p.time_ratio, p.time_ratio_low, p.time_ratio_high) : "-";
      if (!p.fits) row.note = row.note.empty() ? "does not fit" : "does not fit: " + row.note;
    }
    rows.push_back(row);
  }
  return rows;
}

std::string bench_header(const BenchResult& r) {
  return fmt::format("device {}, baseline {} (parameters {}, gradients {}; Adam's moments would add {}); {} rounds, "
                     "policies interleaved; time x none: ratio of the means of the fastest 30% of steps, with its 95% interval; {}",
                     r.device, bytes_text(static_cast<double>(r.baseline_bytes)),
                     bytes_text(static_cast<double>(r.parameter_bytes)), bytes_text(static_cast<double>(r.gradient_bytes)),
                     bytes_text(static_cast<double>(r.adam_state_bytes)), r.rounds, r.clock);
}

std::string recommendation_text(const BenchResult& r, const std::string& open, const std::string& close) {
  return fmt::format("{} ({})", r.recommendation.empty() ? "none" : open + r.recommendation + close, r.reason);
}

std::vector<std::string> bench_lines(const BenchResult& r) {
  std::vector<std::string> out;
  out.push_back("bench: " + bench_header(r));
  out.push_back(fmt::format("  {:<16} {:>5} {:>12} {:>7} {:>12} {:<30} {:<18}  {}", "policy", "ckpt", "peak", "x none",
                            "analytic", "step time median [min..max]", "x none [95%]", ""));
  for (const auto& row : bench_rows(r)) {
    out.push_back(fmt::format("  {:<16} {:>5} {:>12} {:>7} {:>12} {:<30} {:<18}  {}", row.policy, row.units, row.peak,
                              row.peak_ratio, row.analytic, row.time, row.time_ratio, row.note));
  }
  out.push_back("recommendation: " + recommendation_text(r, "", ""));
  for (const auto& w : r.warnings) out.push_back("warning: " + w);
  if (!r.formula.empty()) out.push_back("analytic: " + r.formula);
  return out;
}

}  // namespace ckcheck
