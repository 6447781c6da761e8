#include "reports/sections.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

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

namespace {

// Round tick values spanning [lo, hi]: steps of 1, 2 or 5 times a power of ten, about `want` of them.
std::vector<double> nice_ticks(double lo, double hi, int want) {
  if (!(hi > lo)) hi = lo + (lo == 0 ? 1.0 : std::abs(lo) * 0.1);
  const double raw = (hi - lo) / want;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  // From the tick at or below lo to the one at or above hi, so the ticks span every value.
  std::vector<double> out;
  const auto first = static_cast<int64_t>(std::floor(lo / step + 1e-9));
  const auto last = static_cast<int64_t>(std::ceil(hi / step - 1e-9));
  for (int64_t k = first; k <= last; ++k) out.push_back(static_cast<double>(k) * step);
  return out;
}

// A tick value with as many decimals as its step needs.
std::string tick_text(double v, double step) {
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  return fmt::format("{:.{}f}", v, decimals);
}

struct Box {
  double x0, y0, x1, y1;
  bool overlaps(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
};

}  // namespace

namespace {

struct ChartPoint {
  std::string label;
  double t, tlo, thi, mem;  // time x none (with its interval), MiB above the baseline
  bool fits, ranked, failed, chosen;
};

// The chart's frame: what the axes span, in what units, and where the budget is drawn.
struct Chart {
  static constexpr double W = 720, H = 440, L = 80, R = 30, T = 30, B = 56;
  bool ratio = false;   // time as a ratio to none (else milliseconds)
  bool budget = false;  // a memory budget was given
  double budget_mib = 0.0;
  bool budget_shown = false;  // near the policies: drawn as a line (else a note says where it is)
  bool in_gib = false;
  double m_unit = 1.0;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  double x(double t) const { return L + (W - L - R) * (t - x0) / (x1 - x0); }
  double y(double m) const { return H - B - (H - T - B) * (m - y0) / (y1 - y0); }
};

std::vector<ChartPoint> chart_points(const BenchResult& r) {
  std::vector<ChartPoint> pts;
  const bool ratio = measured_none(r) != nullptr;
  for (const auto& p : r.policies) {
    if (p.measurement.step_seconds.empty()) continue;
    pts.push_back({p.policy, ratio ? p.time_ratio : p.time_median_s * 1e3, ratio ? p.time_ratio_low : p.time_min_s * 1e3,
                   ratio ? p.time_ratio_high : p.time_max_s * 1e3, static_cast<double>(p.measurement.peak_bytes) / 1048576.0,
                   p.fits, p.ranked, p.checks && p.checks != Verdict::kPass,
                   !r.recommendation.empty() && r.recommendation == p.policy});
  }
  return pts;
}

Chart chart_of(const BenchResult& r, const std::vector<ChartPoint>& pts) {
  Chart c;
  c.ratio = measured_none(r) != nullptr;
  c.budget = r.memory_budget_bytes >= 0;
  c.budget_mib = c.budget ? static_cast<double>(r.memory_budget_bytes - r.baseline_bytes) / 1048576.0 : 0.0;
  double tlo = 1e300, thi = -1e300, mlo = 1e300, mhi = -1e300;
  for (const auto& p : pts) {
    tlo = std::min(tlo, p.t), thi = std::max(thi, p.t);
    mlo = std::min(mlo, p.mem), mhi = std::max(mhi, p.mem);
  }
  // The budget line widens the axis only where it lies near the policies; far above, a note says where.
  c.budget_shown = c.budget && c.budget_mib > 0 && c.budget_mib <= mhi + 0.5 * (mhi - mlo) + 1e-9 &&
                   c.budget_mib >= mlo - 0.5 * (mhi - mlo) - 1e-9;
  if (c.budget_shown) mlo = std::min(mlo, c.budget_mib), mhi = std::max(mhi, c.budget_mib);
  c.in_gib = mhi >= 2048;
  c.m_unit = c.in_gib ? 1024.0 : 1.0;
  // Axes span the data with a margin, from round ticks: the differences between policies fill the plot.
  const double tpad = std::max((thi - tlo) * 0.08, std::abs(thi) * 0.01), mpad = std::max((mhi - mlo) * 0.08, std::abs(mhi) * 0.01 + 1e-6);
  // The axes end a margin past the outermost points (not at the next round tick, which could leave
  // half the plot empty); the round ticks are those inside.
  c.x0 = std::max(tlo - tpad, 0.0), c.x1 = thi + tpad;
  c.y0 = std::max(mlo - mpad, 0.0), c.y1 = mhi + mpad;
  return c;
}

std::vector<double> ticks_inside(double lo, double hi) {
  auto ticks = nice_ticks(lo, hi, 5);
  ticks.erase(std::remove_if(ticks.begin(), ticks.end(), [&](double v) { return v < lo - 1e-12 || v > hi + 1e-12; }),
              ticks.end());
  return ticks;
}

// The plot's frame, grid, ticks and axis titles.
std::string chart_frame(const Chart& c) {
  constexpr double W = Chart::W, H = Chart::H, L = Chart::L, R = Chart::R, T = Chart::T, B = Chart::B;
  const auto xt = ticks_inside(c.x0, c.x1);
  const auto yt = ticks_inside(c.y0 / c.m_unit, c.y1 / c.m_unit);
  std::string svg = fmt::format("<svg class=\"bench-chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
                                "viewBox=\"0 0 {} {}\" font-family=\"sans-serif\" font-size=\"12\">\n",
                                W, H, W, H);
  svg += fmt::format("<rect class=\"plot\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", L, T,
                     W - L - R, H - T - B);
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1.0, ystep = yt.size() > 1 ? yt[1] - yt[0] : 1.0;
  for (double v : xt) {
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/>\n", c.x(v), T, H - B);
    svg += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#444\">{}</text>\n", c.x(v),
                       H - B + 16, tick_text(v, xstep));
  }
  for (double v : yt) {
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#eee\"/>\n", L, c.y(v * c.m_unit), W - R);
    svg += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#444\">{}</text>\n", L - 6,
                       c.y(v * c.m_unit) + 4, tick_text(v, ystep));
  }
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", (L + W - R) / 2, H - 14,
                     c.ratio ? "step time x none (bar: 95% interval)" : "step time, ms (median; bar: min..max)");
  svg += fmt::format("<text x=\"18\" y=\"{0:.1f}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0:.1f})\">peak memory above "
                     "the baseline, {1}</text>\n",
                     (T + H - B) / 2, c.in_gib ? "GiB" : "MiB");
  return svg;
}

// The memory budget: a dashed line where it lies near the policies, else a note saying where it is;
// what it writes is taken for labels.
std::string chart_budget(const Chart& c, std::vector<Box>& taken) {
  constexpr double W = Chart::W, L = Chart::L, R = Chart::R, T = Chart::T;
  std::string svg;
  if (c.budget && !c.budget_shown) {
    const auto note = c.budget_mib > 0 ? fmt::format("memory budget: {} above the baseline, beyond the chart",
                                                     format_bytes(c.budget_mib * 1048576.0))
                                       : std::string("memory budget: below the baseline");
    svg += fmt::format("<text class=\"label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#b00020\">{}</text>\n",
                       W - R - 4, T + 16, note);
    taken.push_back({W - R - 4 - 6.8 * static_cast<double>(note.size()), T + 2, W - R - 4, T + 20});
  }
  if (c.budget_shown) {
    const double by = c.y(c.budget_mib);
    svg += fmt::format("<line class=\"budget\" x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#b00020\" "
                       "stroke-dasharray=\"6 4\"/>\n",
                       L, by, W - R, by);
    const double ly = by - 18 > T ? by - 4 : by + 15;  // above the line, or below it at the top
    svg += fmt::format("<text class=\"label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#b00020\">memory budget</text>\n",
                       W - R - 4, ly);
    taken.push_back({W - R - 4 - 6.8 * 13, ly - 12, W - R - 4, ly + 3});
  }
  return svg;
}

// The Pareto front of the ranked policies (none faster and smaller), as a line.
std::string chart_front(const Chart& c, const std::vector<ChartPoint>& pts) {
  std::vector<const ChartPoint*> front;
  for (const auto& p : pts) {
    if (!p.ranked) continue;
    bool dominated = false;
    for (const auto& q : pts) {
      dominated = dominated || (q.ranked && &q != &p && q.t <= p.t && q.mem <= p.mem && (q.t < p.t || q.mem < p.mem));
    }
    if (!dominated) front.push_back(&p);
  }
  std::sort(front.begin(), front.end(), [](const ChartPoint* a, const ChartPoint* b) { return a->t < b->t; });
  if (front.size() < 2) return "";
  std::string path;
  for (const auto* p : front) path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "" : " ", c.x(p->t), c.y(p->mem));
  return fmt::format("<polyline class=\"front\" points=\"{}\" fill=\"none\" stroke=\"#1f5fa8\" stroke-opacity=\"0.45\" "
                     "stroke-width=\"2\"/>\n",
                     path);
}

std::string point_colour(const ChartPoint& p) {
  return p.chosen ? "#176b2c" : p.failed ? "#b00020" : !p.fits ? "#8a6100" : p.ranked ? "#1f5fa8" : "#888";
}

// A policy's point: its interval (clipped to the plot), and a circle -- or a cross where it fails
// its checks -- with its figures as the title.
std::string chart_point(const Chart& c, const ChartPoint& p) {
  const double px = c.x(p.t), py = c.y(p.mem);
  const auto clip = [&](double v) { return std::clamp(v, Chart::L, Chart::W - Chart::R); };
  std::string svg = fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#888\"/>\n",
                                clip(c.x(p.tlo)), py, clip(c.x(p.thi)), py);
  const std::string colour = point_colour(p);
  const std::string title = fmt::format("{}: {} {:.3g}, {:.3g} MiB above the baseline{}", escape_markup(p.label),
                                        c.ratio ? "time x none" : "ms", p.t, p.mem, p.failed ? " (fails its checks)" : "");
  if (p.failed) {
    return svg + fmt::format("<g class=\"point failed\" stroke=\"{0}\" stroke-width=\"2.5\"><title>{5}</title><line x1=\"{1:.1f}\" "
                             "y1=\"{2:.1f}\" x2=\"{3:.1f}\" y2=\"{4:.1f}\"/><line x1=\"{1:.1f}\" y1=\"{4:.1f}\" x2=\"{3:.1f}\" "
                             "y2=\"{2:.1f}\"/></g>\n",
                             colour, px - 5, py - 5, px + 5, py + 5, title);
  }
  return svg + fmt::format("<circle class=\"point\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\"><title>{}</title></circle>\n",
                           px, py, p.chosen ? 7 : 5, colour, title);
}

struct LabelSpot {
  Box box;
  std::string anchor;
  double x, y;
};

// The first place beside a point, further out step by step, where a label of width w overlaps no
// other label or point and stays inside the plot.
std::optional<LabelSpot> label_spot(double px, double py, double w, const std::vector<Box>& taken) {
  const double h = 14;
  for (int ring = 1; ring <= 8; ++ring) {
    const double d = 8.0 * ring;
    const std::vector<std::tuple<double, double, const char*>> spots = {
        {px + d, py - d / 2, "start"}, {px - d, py - d / 2, "end"}, {px + d, py + d + 8, "start"},
        {px - d, py + d + 8, "end"},   {px, py - d, "middle"},      {px, py + d + 10, "middle"}};
    for (const auto& [sx, sy, a] : spots) {
      const std::string an = a;
      const double bx0 = an == "start" ? sx : an == "end" ? sx - w : sx - w / 2;
      const Box b{bx0, sy - h + 3, bx0 + w, sy + 3};
      if (b.x0 < Chart::L + 2 || b.x1 > Chart::W - Chart::R - 2 || b.y0 < Chart::T + 2 || b.y1 > Chart::H - Chart::B - 2) continue;
      if (std::any_of(taken.begin(), taken.end(), [&](const Box& o) { return o.overlaps(b); })) continue;
      return LabelSpot{b, an, sx, sy};
    }
  }
  return std::nullopt;
}

// A point's label where there is room (a leader line where it stands apart); none where there is
// no room: the point's title and the table below still name it.
std::string chart_label(const Chart& c, const ChartPoint& p, std::vector<Box>& taken) {
  const double px = c.x(p.t), py = c.y(p.mem);
  const std::string text = p.label + (p.chosen ? " (recommended)" : p.failed ? " (fails checks)" : "");
  const auto spot = label_spot(px, py, 6.8 * static_cast<double>(text.size()) + 4, taken);
  if (!spot) return "";
  taken.push_back(spot->box);
  std::string svg;
  if (std::hypot(spot->x - px, spot->y - py) > 20) {
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#bbb\"/>\n", px, py,
                       spot->anchor == "end" ? spot->box.x1 : spot->anchor == "start" ? spot->box.x0 : spot->x, spot->y - 4);
  }
  return svg + fmt::format("<text class=\"label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"{}\" fill=\"{}\"{}>{}</text>\n", spot->x,
                           spot->y, spot->anchor, point_colour(p), p.chosen ? " font-weight=\"bold\"" : "", escape_markup(text));
}

}  // namespace

// What decides between policies, as an SVG scatter chart: peak memory above the baseline against
// step time x none, on axes that span the policies measured (round ticks), the Pareto front of the
// ranked policies drawn, the recommendation and the memory budget marked, a policy that fails its
// checks crossed out, and labels placed where they overlap no other label or point.
std::string bench_svg(const BenchResult& r) {
  const auto pts = chart_points(r);
  if (pts.empty()) return "";
  const Chart c = chart_of(r, pts);
  std::string svg = chart_frame(c);
  std::vector<Box> taken;
  for (const auto& p : pts) taken.push_back({c.x(p.t) - 6, c.y(p.mem) - 6, c.x(p.t) + 6, c.y(p.mem) + 6});
  svg += chart_budget(c, taken);
  svg += chart_front(c, pts);
  for (const auto& p : pts) svg += chart_point(c, p) + chart_label(c, p, taken);
  return svg + "</svg>\n";
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
    row.checks = p.checks ? verdict_name(*p.checks) : "-";
    if (!p.not_ranked.empty()) row.note = "not ranked: " + p.not_ranked;
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
    if (r.parallel && !p.measurement.step_seconds.empty()) {
      // bench --parallel: memory per rank, no time.
      row.time = row.time_ratio = "-";
      std::vector<std::string> peaks;
      for (const auto b : p.rank_peak_bytes) {
        peaks.push_back(b < 0 ? "failed" : bytes_text(static_cast<double>(r.rank_state_bytes + b)));
      }
      row.note = fmt::format("per rank through {}: {} in all (one process: {})", r.parallel == ParallelKind::kFsdp ? "FSDP2" : "DDP",
                             fmt::join(peaks, ", "),
                             bytes_text(static_cast<double>(p.measurement.baseline_bytes + p.measurement.peak_bytes)));
    }
    rows.push_back(row);
  }
  return rows;
}

std::string bench_header(const BenchResult& r) {
  const auto memory = fmt::format("device {}, baseline {} (parameters {}, gradients {}; Adam's moments would add {})",
                                  r.device, bytes_text(static_cast<double>(r.baseline_bytes)),
                                  bytes_text(static_cast<double>(r.parameter_bytes)),
                                  bytes_text(static_cast<double>(r.gradient_bytes)),
                                  bytes_text(static_cast<double>(r.adam_state_bytes)));
  if (r.parallel) return memory + "; memory per rank, no time";
  return fmt::format("{}; {} rounds, policies interleaved; time x none: ratio of the means of the fastest 30% of steps, "
                     "with its 95% interval; {}",
                     memory, r.rounds, r.clock);
}

std::string recommendation_text(const BenchResult& r, const std::string& open, const std::string& close) {
  // "none" is a policy's name: without a recommendation, say so in words.
  return fmt::format("{} ({})", r.recommendation.empty() ? "no policy" : open + r.recommendation + close, r.reason);
}

std::vector<std::string> bench_lines(const BenchResult& r) {
  std::vector<std::string> out;
  out.push_back("bench: " + bench_header(r));
  if (!r.offload.empty()) out.push_back(fmt::format("offload {}: {}", r.offload, r.offload_note));
  if (r.parallel) out.push_back(fmt::format("parallel {}, {} ranks: {}", parallel_kind_name(*r.parallel), r.world_size, r.parallel_note));
  out.push_back(fmt::format("  {:<16} {:>5} {:>12} {:>7} {:>12} {:<30} {:<18} {:<6}  {}", "policy", "ckpt", "peak",
                            "x none", "analytic", "step time median [min..max]", "x none [95%]", "checks", ""));
  for (const auto& row : bench_rows(r)) {
    out.push_back(fmt::format("  {:<16} {:>5} {:>12} {:>7} {:>12} {:<30} {:<18} {:<6}  {}", row.policy, row.units,
                              row.peak, row.peak_ratio, row.analytic, row.time, row.time_ratio, row.checks, row.note));
  }
  out.push_back("recommendation: " + recommendation_text(r, "", ""));
  for (const auto& w : r.warnings) out.push_back("warning: " + w);
  if (!r.formula.empty()) out.push_back("analytic: " + r.formula);
  return out;
}

std::vector<PlanRow> plan_rows(const MemoryPlan& p) {
  std::vector<PlanRow> rows;
  const double plain = p.profile.step_seconds;
  for (const auto& a : p.attempts) {
    PlanRow row;
    row.policy = a.policy;
    row.units = std::to_string(a.sites.size());
    row.predicted_peak = bytes_text(static_cast<double>(a.predicted_peak_bytes));
    row.predicted_time = plain > 0 ? fmt::format("{:.2f}", a.predicted_seconds / plain) : "-";
    row.checks = a.checks ? verdict_name(*a.checks) : "-";
    row.outcome = a.outcome;
    row.measured_peak = row.peak_error = row.measured_time = "-";
    if (const auto* m = measured_plan(p, a.policy)) {
      const auto measured = static_cast<double>(m->measurement.peak_bytes);
      row.measured_peak = bytes_text(measured);
      if (measured > 0) row.peak_error = fmt::format("{:.1f}%", 100.0 * (static_cast<double>(a.predicted_peak_bytes) - measured) / measured);
      row.measured_time = fmt::format("{:.2f} [{:.2f}, {:.2f}]", m->time_ratio, m->time_ratio_low, m->time_ratio_high);
    }
    rows.push_back(row);
  }
  return rows;
}

std::vector<SiteRow> plan_site_rows(const MemoryPlan& p) {
  std::vector<SiteRow> rows;
  for (const auto& s : p.profile.sites) {
    rows.push_back({s.site, bytes_text(static_cast<double>(s.input_bytes)), bytes_text(static_cast<double>(s.kept_bytes)),
                    bytes_text(static_cast<double>(s.recompute_extra_bytes)), seconds_text(s.recompute_seconds)});
  }
  return rows;
}

std::vector<OpClassRow> plan_op_class_rows(const MemoryPlan& p) {
  std::vector<OpClassRow> rows;
  const auto& classes = p.profile.op_classes;
  for (size_t i = 0; i < classes.size() && i < kSacClasses; ++i) {
    const auto& c = classes[i];
    rows.push_back({c.op, std::to_string(c.calls), bytes_text(static_cast<double>(c.bytes())), seconds_text(c.seconds())});
  }
  return rows;
}

std::string plan_op_class_note(const MemoryPlan& p) {
  const auto& f = p.profile;
  if (f.op_classes.empty()) return f.op_classes_note;
  if (f.op_classes.size() <= kSacClasses) return "";
  return fmt::format("{} op classes taking less time are always recomputed by selective plans", f.op_classes.size() - kSacClasses);
}

std::string plan_header(const MemoryPlan& p) {
  const auto& f = p.profile;
  return fmt::format("budget {} in all: parameters, gradients and inputs take {}, leaving {} for the step; the plain step peaks "
                     "{} above them ({} in all) and takes {}; {} candidate sites profiled over {} plain steps",
                     bytes_text(static_cast<double>(p.memory_budget_bytes)), bytes_text(static_cast<double>(f.baseline_bytes)),
                     bytes_text(static_cast<double>(std::max<int64_t>(0, p.memory_budget_bytes - f.baseline_bytes))),
                     bytes_text(static_cast<double>(f.peak_bytes)), bytes_text(static_cast<double>(f.peak_bytes + f.baseline_bytes)),
                     seconds_text(f.step_seconds), f.sites.size(), f.steps);
}

std::string plan_profile_note(const MemoryPlan& p) {
  const auto& f = p.profile;
  if (f.uncalibrated.empty()) return "";
  return fmt::format("not measured checkpointed, so estimated from the plain step: {} ({})", fmt::join(f.uncalibrated, ", "),
                     f.calibration_note);
}

std::string plan_recommendation_text(const MemoryPlan& p, const std::string& open, const std::string& close) {
  return fmt::format("{} ({})", p.recommendation.empty() ? "no plan" : open + p.recommendation + close, p.reason);
}

std::vector<std::string> plan_lines(const MemoryPlan& p, const std::string& run_command) {
  std::vector<std::string> out;
  out.push_back("plan: " + plan_header(p));
  out.push_back(fmt::format("  {:<20} {:>10} {:>12} {:>14} {:>10}", "site", "input", "frees", "adds backward", "adds time"));
  for (const auto& row : plan_site_rows(p)) {
    out.push_back(fmt::format("  {:<20} {:>10} {:>12} {:>14} {:>10}", row.site, row.input, row.kept, row.extra, row.recompute));
  }
  if (const auto note = plan_profile_note(p); !note.empty()) out.push_back("profile: " + note);
  if (const auto rows = plan_op_class_rows(p); !rows.empty()) {
    out.push_back(fmt::format("  {:<28} {:>6} {:>12} {:>12}", "op class (selective plans)", "calls", "saving keeps", "spares"));
    for (const auto& row : rows) out.push_back(fmt::format("  {:<28} {:>6} {:>12} {:>12}", row.op, row.calls, row.keeps, row.spares));
  }
  if (const auto note = plan_op_class_note(p); !note.empty()) out.push_back("op classes: " + note);
  out.push_back(fmt::format("solver: {}; {} pairs kept in all, at most {} after one site{}", p.solver, p.stats.states,
                            p.stats.largest_front, p.sac_subsets > 0 ? fmt::format("; {} op-class subsets weighed", p.sac_subsets) : ""));
  out.push_back(fmt::format("  {:<24} {:>5} {:>12} {:>12} {:>7} {:>10} {:<20} {:<6}  {}", "plan", "ckpt", "predicted", "measured",
                            "error", "time pred", "time x none [95%]", "checks", "outcome"));
  for (const auto& row : plan_rows(p)) {
    out.push_back(fmt::format("  {:<24} {:>5} {:>12} {:>12} {:>7} {:>10} {:<20} {:<6}  {}", row.policy, row.units, row.predicted_peak,
                              row.measured_peak, row.peak_error, row.predicted_time, row.measured_time, row.checks, row.outcome));
  }
  out.push_back("recommendation: " + plan_recommendation_text(p, "", ""));
  if (!run_command.empty()) out.push_back("run it: " + run_command);
  for (const auto& w : p.measured.warnings) out.push_back("warning: " + w);
  return out;
}

namespace {

// A cell as the matrix shows it: the outcome, with the causes found where they are not the class's.
std::string cell_text(const SelftestCell& c) {
  if (c.outcome == "other-cause") return fmt::format("other: {}", fmt::join(c.found, ","));
  if (c.outcome == "caught") return "caught";
  return c.outcome;
}

}  // namespace

std::vector<std::string> selftest_lines(const SelftestResult& s) {
  std::vector<std::string> lines;
  lines.push_back(fmt::format("selftest: {} planted {}; the unplanted model: {}{}", s.cells.size(),
                              s.cells.size() == 1 ? "run" : "runs", verdict_name(s.unplanted),
                              s.unplanted_failing.empty() ? ""
                                                          : fmt::format(" ({})", fmt::join(s.unplanted_failing, "; "))));
  std::vector<std::string> sites;
  for (const auto& c : s.cells) {
    if (std::find(sites.begin(), sites.end(), c.site) == sites.end()) sites.push_back(c.site);
  }
  size_t width = 12;
  for (const auto& site : sites) width = std::max(width, site.size());
  for (const auto& c : s.cells) width = std::max(width, cell_text(c).size());
  std::string head = fmt::format("  {:<18} {:<18}", "class", "cause");
  for (const auto& site : sites) head += fmt::format(" {:<{}}", site, width);
  lines.push_back(head);
  for (const auto& row : s.classes) {
    std::string line = fmt::format("  {:<18} {:<18}", row.plant, row.cause);
    if (!row.not_applicable.empty()) {
      lines.push_back(line + " n/a: " + row.not_applicable);
      continue;
    }
    for (const auto& site : sites) {
      const auto it = std::find_if(s.cells.begin(), s.cells.end(),
                                   [&](const SelftestCell& c) { return c.plant == row.plant && c.site == site; });
      line += fmt::format(" {:<{}}", it == s.cells.end() ? "." : cell_text(*it), width);
    }
    lines.push_back(line);
  }
  const size_t live = s.count("caught") + s.count("other-cause") + s.count("missed");
  lines.push_back(fmt::format("caught with the right cause: {} of {} live plants ({:.0f}%); another cause: {}; missed: "
                              "{}; dormant (the configuration is immune): {}; false alarms: {}; errors: {}",
                              s.count("caught"), live, 100.0 * s.caught_share(), s.count("other-cause"),
                              s.count("missed"), s.count("dormant"), s.count("false-alarm"), s.count("error")));
  if (s.plain_step_seconds > 0) {
    lines.push_back(fmt::format("selftest cost: {:.1f} plain steps of CPU time (the unplanted run and {} planted; the "
                                "plain step: {})",
                                s.cpu_seconds / s.plain_step_seconds, s.cells.size(), seconds_text(s.plain_step_seconds)));
  }
  for (const auto& c : s.cells) {
    if (c.outcome == "caught" || c.outcome == "dormant") continue;
    lines.push_back(fmt::format("{} {} at {}{}: {}", c.outcome, c.plant, c.site, c.note.empty() ? "" : " (" + c.note + ")",
                                c.reproduce));
  }
  return lines;
}

}  // namespace ckcheck
