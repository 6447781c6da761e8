#include "harness/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/errors.h"
#include "harness/text.h"

namespace ckcheck {

const std::vector<std::string>& default_bench_policies() {
  static const std::vector<std::string> p = {"none",          "every:1",      "every:2",    "every:4",
                                             "segments:sqrt", "sites:*.attn", "sites:*.ffn"};
  return p;
}

std::optional<double> analytic_activation_bytes(const Model& model, const Plan& plan, int element_bytes) {
  const auto mem = model.analytic_memory(element_bytes);
  if (mem.empty()) return std::nullopt;
  auto get = [&](const std::string& site) {
    auto it = mem.find(site);
    return it == mem.end() ? SiteMemory{} : it->second;
  };
  // The outermost sites in forward order; a segment of several of them counts as one.
  const auto sites = model.sites();
  std::vector<std::vector<std::string>> tops;
  for (const auto& s : sites) {
    bool nested = false;
    for (const auto& o : sites) nested = nested || (o != s && site_within(s, o));
    if (nested) continue;
    const std::vector<std::string>* segment = nullptr;
    for (const auto& u : plan.units) {
      if (u.size() > 1 && std::find(u.begin(), u.end(), s) != u.end()) segment = &u;
    }
    if (segment && !tops.empty() && tops.back() == *segment) continue;
    tops.push_back(segment ? *segment : std::vector<std::string>{s});
  }
  // The forward keeps, per top: its activations, or -- where checkpointed -- the inputs of its
  // checkpointed units instead of their activations. The backward walks back and, at each top,
  // holds what the tops before it keep plus what it rebuilds: a checkpointed top its input and
  // activations, a top with checkpointed units inside the largest of those.
  double prefix = 0.0, peak = 0.0;
  for (const auto& top : tops) {
    double all = 0.0;
    for (const auto& s : top) all += get(s).stored;
    const bool whole = std::any_of(plan.units.begin(), plan.units.end(), [&](const auto& u) { return u == top; });
    double stored = all, during = all;
    if (whole) {
      stored = get(top.front()).input;
      during = stored + all;
    } else {
      double rebuilt = 0.0;
      for (const auto& u : plan.units) {
        if (u.size() != 1 || !site_within(u[0], top.front()) || u[0] == top.front()) continue;
        const auto m = get(u[0]);
        stored += m.input - m.stored;
        rebuilt = std::max(rebuilt, m.stored);
      }
      during = stored + rebuilt;
    }
    peak = std::max(peak, prefix + during);
    prefix += stored;
  }
  return peak;
}

namespace {

int64_t bytes_of(const NamedTensors& tensors) {
  int64_t n = 0;
  for (const auto& [name, t] : tensors) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

int64_t numel_of(const NamedTensors& tensors) {
  int64_t n = 0;
  for (const auto& [name, t] : tensors) n += t.numel();
  return n;
}

}  // namespace

BenchResult run_bench(Runner& runner, const std::vector<std::string>& site_globs, const BenchOptions& options) {
  auto& model = runner.model();
  const auto& config = runner.config();
  BenchResult r;
  r.device = config.device.str();
  r.memory_budget_bytes = options.memory_budget_bytes;
  r.max_overhead = options.max_overhead;
  r.formula = model.analytic_formula();
  const auto params = model.named_parameters();
  r.parameter_bytes = bytes_of(params);
  NamedTensors trainable;
  for (const auto& p : params) {
    if (p.second.requires_grad()) trainable.push_back(p);
  }
  r.gradient_bytes = bytes_of(trainable);
  r.adam_state_bytes = 2 * 4 * numel_of(trainable);  // two fp32 moments per trainable parameter
  const int element_bytes = config.amp == Amp::kOff ? 4 : 2;

  const bool given = !options.policies.empty();
  const auto& names = given ? options.policies : default_bench_policies();
  // Plans first, so a bad policy stops the command before anything is measured.
  struct Entry {
    std::string name;
    std::optional<Plan> plan;
    std::string why_not;
  };
  std::vector<Entry> entries;
  size_t measurable = 0;
  for (const auto& name : names) {
    try {
      entries.push_back({name, Plan::make(model, site_globs, Policy::parse(name)), ""});
      ++measurable;
    } catch (const UsageError& e) {
      if (given) throw;  // a policy the user asked for must apply
      entries.push_back({name, std::nullopt, std::string("not applicable: ") + e.what()});
    }
  }
  size_t index = 0;
  for (const auto& e : entries) {
    PolicyBench b;
    b.policy = e.plan ? e.plan->policy.text() : e.name;
    if (!e.plan) {
      b.note = e.why_not;
      r.policies.push_back(b);
      continue;
    }
    if (options.progress) options.progress(index, measurable, b.policy);
    ++index;
    b.checkpointed = e.plan->checkpointed();
    b.analytic_bytes = analytic_activation_bytes(model, *e.plan, element_bytes);
    b.measurement = runner.measure(e.plan->units.empty() ? nullptr : &*e.plan, options.warmup, options.steps);
    const auto& m = b.measurement;
    if (!m.error.empty()) b.note = m.error;
    b.fits = m.fits;
    if (!m.step_seconds.empty()) {
      b.time_median_s = median(m.step_seconds);
      b.time_min_s = *std::min_element(m.step_seconds.begin(), m.step_seconds.end());
      b.time_max_s = *std::max_element(m.step_seconds.begin(), m.step_seconds.end());
      b.forward_median_s = median(m.forward_seconds);
      r.baseline_bytes = std::max(r.baseline_bytes, m.baseline_bytes);
    }
    if (options.memory_budget_bytes >= 0 && m.baseline_bytes + m.peak_bytes > options.memory_budget_bytes) {
      b.fits = false;
    }
    r.policies.push_back(b);
  }
  if (options.progress) options.progress(index, measurable, "");
  recommend(r);
  return r;
}

void recommend(BenchResult& r) {
  const PolicyBench* none = nullptr;
  std::vector<const PolicyBench*> measured;
  for (const auto& p : r.policies) {
    if (p.measurement.step_seconds.empty()) continue;
    measured.push_back(&p);
    if (p.policy == "none") none = &p;
  }
  r.warnings.clear();
  if (measured.empty()) {
    r.reason = "no policy could be measured";
    return;
  }
  auto total = [](const PolicyBench* p) { return static_cast<double>(p->measurement.baseline_bytes + p->measurement.peak_bytes); };
  auto overhead = [&](const PolicyBench* p) {
    return none && none->time_median_s > 0 ? p->time_median_s / none->time_median_s - 1.0 : 0.0;
  };

  for (const auto* p : measured) {
    if (p == none || !none) continue;
    if (overhead(p) > r.max_overhead) {
      r.warnings.push_back(fmt::format(
          "{}: step time +{:.0f}% over none, more than {:.0f}%: the checkpoints are too fine (expect "
          "20-40%); checkpoint less often (every:4) or only the modules with large activations",
          p->policy, 100 * overhead(p), 100 * r.max_overhead));
    }
  }
  if (none) {
    const PolicyBench* smallest = *std::min_element(measured.begin(), measured.end(), [&](auto* a, auto* b) { return total(a) < total(b); });
    const double saved = (total(none) - total(smallest)) / total(none);
    if (smallest != none && saved < 0.10) {
      const double activations = static_cast<double>(none->measurement.peak_bytes);
      std::vector<std::pair<double, std::string>> parts = {
          {static_cast<double>(r.parameter_bytes), "parameters"},
          {static_cast<double>(r.gradient_bytes), "gradients"},
          {static_cast<double>(r.adam_state_bytes), "Adam's two fp32 moments (estimate)"},
          {activations, "activations and temporaries"}};
      std::sort(parts.rbegin(), parts.rend());
      r.warnings.push_back(fmt::format(
          "checkpointing saves {:.1f}% of the step's memory at best ({}): it is not effective here; "
          "the largest part is {} ({}), then {} ({}); consider mixed precision or optimizer-state "
          "sharding instead",
          100 * saved, smallest->policy, parts[0].second, format_bytes(parts[0].first), parts[1].second,
          format_bytes(parts[1].first)));
    }
  }

  std::vector<const PolicyBench*> fitting;
  for (const auto* p : measured) {
    if (p->fits) fitting.push_back(p);
  }
  if (r.memory_budget_bytes >= 0) {
    if (fitting.empty()) {
      const PolicyBench* smallest = *std::min_element(measured.begin(), measured.end(), [&](auto* a, auto* b) { return total(a) < total(b); });
      r.recommendation.clear();
      r.reason = fmt::format("no policy fits in {}: the smallest, {}, needs {}", format_bytes(static_cast<double>(r.memory_budget_bytes)),
                             smallest->policy, format_bytes(total(smallest)));
      r.warnings.push_back(r.reason);
      return;
    }
    const auto* best = *std::min_element(fitting.begin(), fitting.end(), [](auto* a, auto* b) { return a->time_median_s < b->time_median_s; });
    r.recommendation = best->policy;
    r.reason = fmt::format("the fastest policy that fits in {} ({} needed)", format_bytes(static_cast<double>(r.memory_budget_bytes)),
                           format_bytes(total(best)));
    return;
  }

  // No budget: the knee of the memory-time curve, over the policies no other beats on both.
  std::vector<const PolicyBench*> front;
  for (const auto* p : fitting) {
    bool dominated = false;
    for (const auto* q : fitting) {
      dominated = dominated || (q != p && q->time_median_s <= p->time_median_s && total(q) <= total(p) &&
                                (q->time_median_s < p->time_median_s || total(q) < total(p)));
    }
    if (!dominated) front.push_back(p);
  }
  if (front.empty()) front = fitting.empty() ? measured : fitting;
  std::sort(front.begin(), front.end(), [](auto* a, auto* b) { return a->time_median_s < b->time_median_s; });
  const PolicyBench* pick = front.front();
  if (front.size() >= 3) {
    const double t0 = front.front()->time_median_s, t1 = front.back()->time_median_s;
    const double m0 = total(front.back()), m1 = total(front.front());
    double best = std::numeric_limits<double>::infinity();
    for (const auto* p : front) {
      // Normalised, the front runs from (0, 1) (fastest) to (1, 0) (smallest); the knee lies
      // furthest below the line between them.
      const double tn = t1 > t0 ? (p->time_median_s - t0) / (t1 - t0) : 0.0;
      const double mn = m1 > m0 ? (total(p) - m0) / (m1 - m0) : 0.0;
      if (tn + mn < best) {
        best = tn + mn;
        pick = p;
      }
    }
    r.reason = "the knee of the memory-time curve: the most memory saved per unit of time spent";
  } else {
    // Two points or one: take the smaller one when it saves at least 10% within the overhead bound.
    const auto* small = front.back();
    if (small != pick && none && overhead(small) <= r.max_overhead && (total(pick) - total(small)) >= 0.10 * total(pick)) {
      pick = small;
      r.reason = fmt::format("saves {:.0f}% of the step's memory for +{:.0f}% time", 100 * (1 - total(small) / total(front.front())),
                             100 * overhead(small));
    } else {
      r.reason = "no policy saves enough memory to pay for its time";
    }
  }
  r.recommendation = pick->policy;
}

nlohmann::json bench_json(const BenchResult& r) {
  nlohmann::json j;
  j["device"] = r.device;
  j["baseline_bytes"] = r.baseline_bytes;
  j["parameter_bytes"] = r.parameter_bytes;
  j["gradient_bytes"] = r.gradient_bytes;
  j["adam_state_bytes"] = r.adam_state_bytes;
  j["memory_budget_bytes"] = r.memory_budget_bytes >= 0 ? nlohmann::json(r.memory_budget_bytes) : nlohmann::json(nullptr);
  j["max_overhead"] = r.max_overhead;
  j["analytic_formula"] = r.formula;
  const PolicyBench* none = nullptr;
  for (const auto& p : r.policies) {
    if (p.policy == "none" && !p.measurement.step_seconds.empty()) none = &p;
  }
  j["policies"] = nlohmann::json::array();
  for (const auto& p : r.policies) {
    nlohmann::json pj = {{"policy", p.policy}, {"checkpointed", p.checkpointed}, {"fits", p.fits}, {"note", p.note}};
    if (p.measurement.step_seconds.empty()) {
      pj["peak_bytes"] = nullptr;
      pj["time_median_s"] = nullptr;
    } else {
      pj["peak_bytes"] = p.measurement.peak_bytes;
      pj["time_median_s"] = p.time_median_s;
      pj["time_min_s"] = p.time_min_s;
      pj["time_max_s"] = p.time_max_s;
      pj["forward_median_s"] = p.forward_median_s;
      pj["steps"] = p.measurement.step_seconds.size();
      if (none) {
        pj["peak_ratio"] = none->measurement.peak_bytes > 0
                               ? static_cast<double>(p.measurement.peak_bytes) / none->measurement.peak_bytes
                               : 1.0;
        pj["time_ratio"] = none->time_median_s > 0 ? p.time_median_s / none->time_median_s : 1.0;
        // How many forwards of the plain model the checkpointing costs (the recompute should
        // cost about one forward of the checkpointed sites).
        pj["extra_time_in_forwards"] = none->forward_median_s > 0
                                           ? (p.time_median_s - none->time_median_s) / none->forward_median_s
                                           : 0.0;
      }
    }
    pj["analytic_bytes"] = p.analytic_bytes ? nlohmann::json(*p.analytic_bytes) : nlohmann::json(nullptr);
    j["policies"].push_back(pj);
  }
  j["recommendation"] = r.recommendation.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.recommendation);
  j["recommendation_reason"] = r.reason;
  j["warnings"] = r.warnings;
  return j;
}

int64_t parse_bytes(const std::string& text) {
  // The number, then the unit: split where the digits end.
  size_t used = 0;
  while (used < text.size() && (std::isdigit(static_cast<unsigned char>(text[used])) || text[used] == '.')) ++used;
  const auto number = parse_double(text.substr(0, used));
  const double v = number ? *number : -1;
  if (!number) used = 0;
  std::string unit = used ? text.substr(used) : "";
  const std::vector<std::pair<std::string, double>> units = {
      {"", 1},       {"B", 1},          {"KiB", 1024.0},   {"MiB", 1048576.0}, {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"K", 1024.0}, {"M", 1048576.0}, {"G", 1073741824.0}};
  for (const auto& [name, factor] : units) {
    if (used && unit == name && v >= 0 && std::isfinite(v)) return static_cast<int64_t>(v * factor);
  }
  throw UsageError(fmt::format("memory size '{}' not understood; write it as 8GiB, 512MiB, 1.5GB or a number of bytes", text));
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::abs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

}  // namespace ckcheck
