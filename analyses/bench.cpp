#include "analyses/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <tuple>

#include "analyses/session.h"
#include "harness/support/errors.h"
#include "harness/support/memory.h"
#include "harness/support/text.h"

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

// What the ranking resolves. Run to run, on a machine that other processes share, the point
// estimates of the time ratios move by up to about 4% of none's step while the bootstrap
// intervals widen to +-8% and narrow again with the load (scripts/bench_stability.py): ranking on
// interval overlap, or on differences smaller than that, made the recommendation follow the
// load. So times closer than kTimeResolution, and peaks closer than kMemoryResolution of the
// largest, count as equal; the intervals are reported, and judge a policy that does more work
// than none but measures faster (a noisy machine).
constexpr double kTimeResolution = 0.04;
constexpr double kMemoryResolution = 0.02;
// The widest interval (half-width, in none's steps) at which that ranking still gave the same
// advice in those runs: wider, and the time verdict is withheld (withhold_imprecise_times). A CPU
// hog beside the bench widens intervals to +-10-40%.
constexpr double kIntervalLimit = 0.08;

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

namespace {

// The mean of the fastest 30% of a sample (at least one value): other processes only ever add
// time to a step, so the fastest steps are the ones they left alone; averaging several of them is
// steadier than any single order statistic.
double fast_mean(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto k = std::max<size_t>(1, static_cast<size_t>(std::lround(0.3 * static_cast<double>(v.size()))));
  return std::accumulate(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), 0.0) / static_cast<double>(k);
}

}  // namespace

std::array<double, 3> fast_ratio(const std::vector<double>& num, const std::vector<double>& den) {
  if (num.empty() || den.empty()) return {1.0, 1.0, 1.0};
  if (num == den) return {1.0, 1.0, 1.0};
  const double d = fast_mean(den);
  if (!(d > 0)) return {1.0, 1.0, 1.0};
  std::mt19937_64 rng(0);
  constexpr int kResamples = 2000;
  std::vector<double> ratios(kResamples);
  std::vector<double> a(num.size()), b(den.size());
  std::uniform_int_distribution<size_t> pick_a(0, num.size() - 1), pick_b(0, den.size() - 1);
  for (auto& r : ratios) {
    for (auto& x : a) x = num[pick_a(rng)];
    for (auto& x : b) x = den[pick_b(rng)];
    const double fb = fast_mean(b);
    r = fb > 0 ? fast_mean(a) / fb : 1.0;
  }
  std::sort(ratios.begin(), ratios.end());
  return {fast_mean(num) / d, ratios[kResamples / 40], ratios[kResamples - 1 - kResamples / 40]};
}

namespace {

// A policy to measure: its plan, or why it does not apply.
struct Entry {
  std::string name;
  std::optional<Plan> plan;
  std::string why_not;
};

std::vector<Entry> bench_entries(const Model& model, const std::vector<std::string>& site_globs,
                                 const BenchOptions& options) {
  const bool given = !options.policies.empty();
  auto names = given ? options.policies : default_bench_policies();
  // Compiled, the compiler's memory budgets are policies beside the module checkpoints.
  if (!given && model.compiled_steps()) {
    for (const char* b : {"budget:0", "budget:0.25", "budget:0.5", "budget:1"}) names.push_back(b);
  }
  // none is the reference of every ratio: always measured, first.
  if (std::find(names.begin(), names.end(), "none") == names.end()) names.insert(names.begin(), "none");
  // --sites must match, as for run and diagnose: a glob that matches nothing is a typing error,
  // not a table of policies that do not apply.
  // The same for a candidate site that cannot be checkpointed: checkpointing every candidate
  // names it.
  Plan::make(model, site_globs, Policy::parse("every:1"));
  std::vector<Entry> entries;
  for (const auto& name : names) {
    try {
      entries.push_back({name, Plan::make(model, site_globs, Policy::parse(name)), ""});
    } catch (const UsageError& e) {
      if (given) throw;  // a policy the user asked for must apply
      entries.push_back({name, std::nullopt, std::string("not applicable: ") + e.what()});
    }
  }
  return entries;
}

void append(Measurement& to, const Measurement& step) {
  to.fits = to.fits && step.fits;
  if (to.error.empty()) to.error = step.error;
  to.baseline_bytes = std::max(to.baseline_bytes, step.baseline_bytes);
  to.peak_bytes = std::max(to.peak_bytes, step.peak_bytes);
  to.step_seconds.insert(to.step_seconds.end(), step.step_seconds.begin(), step.step_seconds.end());
  to.forward_seconds.insert(to.forward_seconds.end(), step.forward_seconds.begin(), step.forward_seconds.end());
  to.cpu_seconds.insert(to.cpu_seconds.end(), step.cpu_seconds.begin(), step.cpu_seconds.end());
  to.instructions.insert(to.instructions.end(), step.instructions.begin(), step.instructions.end());
}

std::vector<double> as_doubles(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// Medians, spread and the paired ratios against none, from the measurement so far.
void summarise(PolicyBench& b, const PolicyBench& none) {
  const auto& m = b.measurement;
  b.fits = b.fits && m.fits;
  if (m.step_seconds.empty()) return;
  b.time_median_s = median(m.step_seconds);
  b.time_min_s = *std::min_element(m.step_seconds.begin(), m.step_seconds.end());
  b.time_max_s = *std::max_element(m.step_seconds.begin(), m.step_seconds.end());
  b.forward_median_s = median(m.forward_seconds);
  b.cpu_median_s = median(m.cpu_seconds);
  const double mean = std::accumulate(m.step_seconds.begin(), m.step_seconds.end(), 0.0) / m.step_seconds.size();
  double var = 0;
  for (double t : m.step_seconds) var += (t - mean) * (t - mean);
  b.time_spread = mean > 0 ? std::sqrt(var / m.step_seconds.size()) / mean : 0.0;
  const auto& n = none.measurement;
  std::tie(b.time_ratio, b.time_ratio_low, b.time_ratio_high) = std::tuple_cat(fast_ratio(m.step_seconds, n.step_seconds));
  std::tie(b.cpu_ratio, b.cpu_ratio_low, b.cpu_ratio_high) = std::tuple_cat(fast_ratio(m.cpu_seconds, n.cpu_seconds));
  b.instructions_ratio.reset();
  if (!m.instructions.empty() && m.instructions.size() == n.instructions.size()) {
    b.instructions_ratio = fast_ratio(as_doubles(m.instructions), as_doubles(n.instructions))[0];
  }
}

// Policies that checkpoint something do strictly more work than none; faster beyond the noise
// means the measurement, not the policy, is wrong. Not so a compiler's budget (budget:F): its
// partitioner may recompute cheap ops to fuse them and move less memory, which can be faster.
std::vector<std::string> faster_than_none(const std::vector<PolicyBench>& policies) {
  std::vector<std::string> out;
  for (const auto& p : policies) {
    const bool budget = p.policy.rfind("budget:", 0) == 0;
    if (!budget && !p.checkpointed.empty() && !p.measurement.step_seconds.empty() && p.time_ratio_high < 1.0) {
      out.push_back(p.policy);
    }
  }
  return out;
}

std::string bench_clock_description(const torch::Device& device) {
  const auto& counter = instruction_counter();
  return fmt::format("time: {}; cpu: the process's CPU time (CLOCK_PROCESS_CPUTIME_ID, all threads); "
                     "instructions: {}",
                     device.is_cuda() ? "CUDA events around the step" : "wall clock (std::chrono::steady_clock)",
                     counter.available() ? "retired by this process's threads started after counting began (perf_event_open)"
                                         : "not counted: " + counter.why_not());
}

// The interleaved rounds of one bench: every policy still measurable runs one step per round, the
// starting policy rotating so that none always runs first.
class Rounds {
 public:
  Rounds(Runner& runner, const std::vector<Entry>& entries, const BenchOptions& options, BenchResult& r)
      : runner_(runner), entries_(entries), options_(options), r_(r),
        compiled_(runner.model().compiled_steps().has_value()) {}

  // Warm-ups first; a policy whose step fails (or does not fit) drops out of the rounds.
  void warm_up(const std::vector<size_t>& active) {
    for (size_t i : active) {
      if (measure_once(i, options_.warmup, 0)) ok_.push_back(i);
    }
    for (size_t i : ok_) {
      if (entries_[i].plan->policy.kind == Policy::Kind::kNone) none_index_ = i;
    }
  }

  void run(int64_t n) {
    const auto steps = static_cast<size_t>(options_.steps);
    for (int64_t k = 0; k < n && !ok_.empty(); ++k, ++rounds_) {
      if (options_.progress) options_.progress(std::min(static_cast<size_t>(rounds_), steps), steps, "interleaved rounds");
      std::vector<size_t> failed;
      for (size_t j = 0; j < ok_.size(); ++j) {
        const size_t i = ok_[(j + static_cast<size_t>(rounds_)) % ok_.size()];
        if (!measure_once(i, 0, 1)) failed.push_back(i);
      }
      for (size_t i : failed) ok_.erase(std::find(ok_.begin(), ok_.end(), i));
    }
  }

  // Ratios against none, for every policy measured.
  void summarise_all(const std::vector<size_t>& active) {
    if (!none_index_) return;
    for (size_t i : active) summarise(r_.policies[i], r_.policies[*none_index_]);
  }

  // An interval wider than +-3% cannot rank policies that differ by a few percent.
  bool imprecise(const std::vector<size_t>& active) const {
    for (size_t i : active) {
      const auto& p = r_.policies[i];
      if (!p.measurement.step_seconds.empty() && (p.time_ratio_high - p.time_ratio_low) / 2 > 0.03 * p.time_ratio) return true;
    }
    return false;
  }

  bool has_none() const { return none_index_.has_value(); }
  int64_t rounds() const { return rounds_; }

 private:
  bool measure_once(size_t i, int64_t warmup, int64_t steps) {
    auto& b = r_.policies[i];
    const Plan* plan = entries_[i].plan->units.empty() ? nullptr : &*entries_[i].plan;
    const auto m = runner_.measure(plan, warmup, steps);
    append(b.measurement, m);
    if (!m.error.empty() && b.note.empty()) b.note = m.error;
    if (options_.memory_budget_bytes >= 0 && m.baseline_bytes + m.peak_bytes > options_.memory_budget_bytes) b.fits = false;
    // A compiled model: the compiler's own estimate, the activations its graphs save for backward
    // (read after the policy's first steps, which ran its variant last).
    if (compiled_ && m.error.empty() && !b.analytic_bytes) {
      b.analytic_bytes = static_cast<double>(runner_.model().compiled_steps()->last_saved_bytes);
    }
    return m.error.empty();
  }

  Runner& runner_;
  const std::vector<Entry>& entries_;
  const BenchOptions& options_;
  BenchResult& r_;
  std::vector<size_t> ok_;
  std::optional<size_t> none_index_;
  int64_t rounds_ = 0;
  bool compiled_;  // asked once: for a Python model the question is a call into Python
};

void measure_interleaved(Runner& runner, const std::vector<Entry>& entries, std::vector<size_t> active,
                         const BenchOptions& options, BenchResult& r) {
  const auto steps = static_cast<size_t>(options.steps);
  if (options.progress) options.progress(0, steps, "warm-up");
  Rounds rounds(runner, entries, options, r);
  rounds.warm_up(active);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  rounds.run(options.steps);
  rounds.summarise_all(active);
  // A policy faster than none beyond the noise is a measurement failure, as is an imprecise
  // ratio: measure more rounds while the time budget lasts.
  while (rounds.has_none() && (rounds.imprecise(active) || !faster_than_none(r.policies).empty()) &&
         elapsed() < options.time_budget_s) {
    rounds.run(std::max<int64_t>(options.steps / 2, 2));
    rounds.summarise_all(active);
  }
  const auto suspicious = faster_than_none(r.policies);
  if (!suspicious.empty()) {
    r.too_noisy = true;
    r.warnings.push_back(fmt::format(
        "{} measured faster than none beyond the noise although it does strictly more work, after {} rounds: the "
        "machine is too noisy for a time verdict (other processes?); only the memory figures stand",
        fmt::join(suspicious, ", "), rounds.rounds()));
  }
  r.rounds = rounds.rounds();
  withhold_imprecise_times(r);
  for (const auto& p : r.policies) r.baseline_bytes = std::max(r.baseline_bytes, p.measurement.baseline_bytes);
  if (options.progress) options.progress(steps, steps, "");
}

// The checks of `ckcheck run` on every measured policy that checkpoints something: a policy whose
// checkpointed step is not the plain step's equal is measured, shown and never ranked.
void verify_policies(Runner& runner, const std::vector<Entry>& entries, const std::vector<size_t>& active,
                     const BenchOptions& options, BenchResult& r) {
  const auto checks = select_checks({});
  std::vector<size_t> todo;
  for (size_t i : active) {
    if (entries[i].plan->units.empty()) continue;
    auto& p = r.policies[i];
    const auto known = options.known_checks.find(p.policy);
    if (known != options.known_checks.end()) {
      std::tie(p.checks, p.check_failures) = known->second;
    } else if (!p.measurement.step_seconds.empty()) {
      todo.push_back(i);
    }
  }
  for (size_t k = 0; k < todo.size(); ++k) {
    auto& p = r.policies[todo[k]];
    const auto& plan = *entries[todo[k]].plan;
    if (options.progress) options.progress(k, todo.size(), "checking " + p.policy);
    const auto outcome = run_checks(runner, plan, options.tolerance, checks);
    p.checks = verdict_of(outcome.results);
    p.check_failures = check_failures(outcome.results);
  }
  if (options.progress && !todo.empty()) options.progress(todo.size(), todo.size(), "");
}

}  // namespace

std::vector<std::string> check_failures(const std::vector<CheckResult>& results) {
  std::vector<std::string> out;
  for (const auto& c : results) {
    if (c.status != Status::kFail && c.status != Status::kError) continue;
    if (c.findings.empty()) {
      out.push_back(fmt::format("{}: {}", c.id, c.summary));
      continue;
    }
    const auto& f = c.findings.front();
    out.push_back(fmt::format("{}: {}{}", c.id, cause_name(f.cause), f.site.empty() ? "" : " at " + f.site));
  }
  return out;
}

namespace {

// What every bench result says of the model before any policy is measured.
BenchResult bench_result_of(Runner& runner, const BenchOptions& options) {
  auto& model = runner.model();
  const auto& config = runner.config();
  BenchResult r;
  r.device = config.device.str();
  r.memory_budget_bytes = options.memory_budget_bytes;
  r.check_command = options.check_command;
  r.max_overhead = options.max_overhead;
  r.formula = model.analytic_formula();
  if (model.compiled_steps()) {
    r.formula = "compiled (--compile): the activations the compiled forward saves for backward, from the compiler's "
                "own graphs (parameters and inputs aside)";
  }
  const auto params = model.named_parameters();
  r.parameter_bytes = bytes_of(params);
  NamedTensors trainable;
  for (const auto& p : params) {
    if (p.second.requires_grad()) trainable.push_back(p);
  }
  r.gradient_bytes = bytes_of(trainable);
  r.adam_state_bytes = 2 * 4 * numel_of(trainable);  // two fp32 moments per trainable parameter
  r.clock = bench_clock_description(config.device);
  return r;
}

// A policy's row before it is measured: its name, and its sites or why it does not apply.
PolicyBench policy_of(const Entry& e) {
  PolicyBench b;
  b.policy = e.plan ? e.plan->policy.text() : e.name;
  b.note = e.why_not;
  if (e.plan) b.checkpointed = e.plan->checkpointed();
  return b;
}

}  // namespace

BenchResult run_bench(Runner& runner, const std::vector<std::string>& site_globs, const BenchOptions& options) {
  auto& model = runner.model();
  BenchResult r = bench_result_of(runner, options);
  const int element_bytes = runner.config().amp == Amp::kOff ? 4 : 2;
  const auto entries = bench_entries(model, site_globs, options);
  std::vector<size_t> active;  // indices into entries and r.policies of the policies measured
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    PolicyBench b = policy_of(e);
    if (e.plan) {
      b.analytic_bytes = analytic_activation_bytes(model, *e.plan, element_bytes);
      active.push_back(i);
    }
    r.policies.push_back(b);
  }
  measure_interleaved(runner, entries, active, options, r);
  if (options.verify) verify_policies(runner, entries, active, options, r);
  recommend(r);
  return r;
}

BenchResult run_bench_per_rank(Runner& runner, const std::vector<std::string>& site_globs, const BenchOptions& options,
                               Collective& group) {
  const auto* dp = runner.config().data_parallel;
  if (!dp || !dp->engine()) throw std::logic_error("run_bench_per_rank: the runner has no data-parallel engine");
  BenchResult r = bench_result_of(runner, options);
  r.parallel = dp->engine()->engine();
  r.world_size = group.world_size();
  const bool sharded_state = r.parallel == ParallelKind::kFsdp;
  const int64_t state = r.parameter_bytes + r.gradient_bytes;
  r.rank_state_bytes = sharded_state ? (state + r.world_size - 1) / r.world_size : state;
  r.parallel_note = fmt::format(
      "each policy measured on one rank's shard of the batch: by the whole module alone on rank 0 (the peak column, "
      "above the baseline), and through {} on every rank (per rank: what the rank holds in all, its {} of "
      "parameters and gradients ({} of {}) plus its step's peak, rank by rank); no time is measured (the ranks "
      "share this machine's cores) and no policy is recommended",
      sharded_state ? "FSDP2" : "DDP", format_bytes(static_cast<double>(r.rank_state_bytes)),
      sharded_state ? fmt::format("1/{}", r.world_size) : std::string("all"), format_bytes(static_cast<double>(state)));
  const auto entries = bench_entries(runner.model(), site_globs, options);
  std::vector<int64_t> mine;  // this rank's peak through the engine, per policy measured
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    PolicyBench b = policy_of(e);
    if (e.plan) {
      if (options.progress) options.progress(i, entries.size(), b.policy);
      b.measurement = runner.measure(&*e.plan, options.warmup, options.steps, /*through_engine=*/false);
      const auto sharded = runner.measure(&*e.plan, options.warmup, options.steps, /*through_engine=*/true);
      if (b.measurement.error.empty() && !sharded.error.empty()) b.measurement.error = sharded.error;
      mine.push_back(sharded.error.empty() ? sharded.peak_bytes : -1);
      r.baseline_bytes = std::max(r.baseline_bytes, b.measurement.baseline_bytes);
    }
    r.policies.push_back(b);
  }
  if (options.progress) options.progress(entries.size(), entries.size(), "");
  // Every rank's peaks, gathered on rank 0 (the others' results are not reported).
  if (group.rank() != 0) {
    group.set(fmt::format("ckcheck/bench/rank/{}", group.rank()), nlohmann::json(mine).dump());
    return r;
  }
  std::vector<std::vector<int64_t>> ranks{mine};
  for (int k = 1; k < r.world_size; ++k) {
    ranks.push_back(nlohmann::json::parse(group.get(fmt::format("ckcheck/bench/rank/{}", k))).get<std::vector<int64_t>>());
  }
  size_t measured = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i].plan) continue;
    for (const auto& peaks : ranks) r.policies[i].rank_peak_bytes.push_back(measured < peaks.size() ? peaks[measured] : -1);
    ++measured;
  }
  r.reason = fmt::format("bench --parallel {} measures memory per rank only", parallel_kind_name(*r.parallel));
  return r;
}


namespace {

using Point = const PolicyBench*;

double total_bytes(Point p) { return static_cast<double>(p->measurement.baseline_bytes + p->measurement.peak_bytes); }

bool same_time(Point a, Point b) { return std::abs(a->time_ratio - b->time_ratio) <= kTimeResolution; }
// a is faster than b beyond the resolution.
bool faster(Point a, Point b) { return a->time_ratio < b->time_ratio && !same_time(a, b); }

// How much a policy recomputes, from its plan alone: fewer checkpointed sites recompute less; of a
// compiler's budgets (which cover every site), the larger budget.
std::pair<size_t, double> recompute_key(Point p) {
  double less_budget = 0.0;
  if (p->policy.rfind("budget:", 0) == 0) less_budget = 1.0 - std::strtod(p->policy.c_str() + 7, nullptr);
  return {p->checkpointed.size(), less_budget};
}

// Memory compared at kMemoryResolution of the largest peak measured.
struct MemoryScale {
  double tolerance = 0;
  explicit MemoryScale(const std::vector<Point>& points) {
    for (const auto* p : points) tolerance = std::max(tolerance, kMemoryResolution * total_bytes(p));
  }
  bool less(Point a, Point b) const { return total_bytes(a) < total_bytes(b) - tolerance; }
  // q is as good as p on both axes and better on one, beyond the resolutions.
  bool dominates(Point q, Point p) const {
    return q != p && !faster(p, q) && !less(p, q) && (less(q, p) || faster(q, p));
  }
};

void warn_too_fine(BenchResult& r, const std::vector<Point>& measured) {
  for (const auto* p : measured) {
    if (p->checkpointed.empty() || p->time_ratio - 1.0 <= r.max_overhead) continue;
    r.warnings.push_back(fmt::format(
        "{}: step time +{:.0f}% over none, more than {:.0f}%: the checkpoints are too fine (expect "
        "20-40%); checkpoint less often (every:4) or only the modules with large activations",
        p->policy, 100 * (p->time_ratio - 1.0), 100 * r.max_overhead));
  }
}

void warn_not_effective(BenchResult& r, const std::vector<Point>& measured, Point none) {
  if (!none) return;
  const auto* smallest = *std::min_element(measured.begin(), measured.end(), [](Point a, Point b) { return total_bytes(a) < total_bytes(b); });
  const double saved = (total_bytes(none) - total_bytes(smallest)) / total_bytes(none);
  if (smallest == none || saved >= 0.10) return;
  std::vector<std::pair<double, std::string>> parts = {
      {static_cast<double>(r.parameter_bytes), "parameters"},
      {static_cast<double>(r.gradient_bytes), "gradients"},
      {static_cast<double>(r.adam_state_bytes), "Adam's two fp32 moments (estimate)"},
      {static_cast<double>(none->measurement.peak_bytes), "activations and temporaries"}};
  std::sort(parts.rbegin(), parts.rend());
  r.warnings.push_back(fmt::format(
      "checkpointing saves {:.1f}% of the step's memory at best ({}): it is not effective here; "
      "the largest part is {} ({}), then {} ({}); consider mixed precision or optimizer-state "
      "sharding instead",
      100 * saved, smallest->policy, parts[0].second, format_bytes(parts[0].first), parts[1].second,
      format_bytes(parts[1].first)));
}

// A compiler's memory budget (budget:F) promises a peak that falls as F falls; a partitioner
// that keeps more at a smaller budget (pytorch/pytorch#197838) is named, beyond the resolution.
void warn_budget_not_monotone(BenchResult& r, const std::vector<Point>& measured) {
  std::vector<std::pair<double, Point>> budgets;
  for (const auto* p : measured) {
    if (p->policy.rfind("budget:", 0) == 0) budgets.emplace_back(std::strtod(p->policy.c_str() + 7, nullptr), p);
  }
  std::sort(budgets.begin(), budgets.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  const MemoryScale memory(measured);
  for (size_t i = 1; i < budgets.size(); ++i) {
    const auto* smaller = budgets[i].second;
    const auto* larger = budgets[i - 1].second;
    if (!memory.less(larger, smaller)) continue;
    r.warnings.push_back(fmt::format(
        "{} peaks at {}, above {} ({}): the compiler's partitioner keeps more as its memory budget falls here; "
        "choose the budget by what this table measures, not by its number",
        smaller->policy, format_bytes(total_bytes(smaller)), larger->policy, format_bytes(total_bytes(larger))));
  }
}

// The names of the points in `tied` other than `chosen`, for "time could not separate ..." notes.
std::string others(const std::vector<Point>& tied, Point chosen) {
  std::vector<std::string> names;
  for (const auto* p : tied) {
    if (p != chosen) names.push_back(p->policy);
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

void recommend_within_budget(BenchResult& r, const std::vector<Point>& measured, const std::vector<Point>& fitting) {
  const auto budget = format_bytes(static_cast<double>(r.memory_budget_bytes));
  if (fitting.empty()) {
    const auto* smallest = *std::min_element(measured.begin(), measured.end(), [](Point a, Point b) { return total_bytes(a) < total_bytes(b); });
    r.reason = fmt::format("no policy fits in {}: the smallest, {}, needs {}", budget, smallest->policy,
                           format_bytes(total_bytes(smallest)));
    r.warnings.push_back(r.reason);
    return;
  }
  if (r.too_noisy) {
    // Without a time verdict: the policy that fits with the least recomputation (the most memory).
    const auto* pick = *std::max_element(fitting.begin(), fitting.end(), [](Point a, Point b) { return total_bytes(a) < total_bytes(b); });
    r.recommendation = pick->policy;
    r.reason = fmt::format("time could not be measured reliably; of the policies that fit in {}, the one that keeps the most "
                           "activations (least recomputation)", budget);
    return;
  }
  const auto* fastest = *std::min_element(fitting.begin(), fitting.end(), [](Point a, Point b) { return a->time_ratio < b->time_ratio; });
  std::vector<Point> tied;
  for (const auto* p : fitting) {
    if (!faster(fastest, p)) tied.push_back(p);
  }
  const auto* best = *std::min_element(tied.begin(), tied.end(), [](Point a, Point b) { return total_bytes(a) < total_bytes(b); });
  r.recommendation = best->policy;
  r.reason = fmt::format("the fastest policy that fits in {} ({} needed)", budget, format_bytes(total_bytes(best)));
  if (tied.size() > 1) {
    r.reason += fmt::format("; its time is within {:.0f}% of {}'s (not ranked: run to run, times move that much), so the one "
                            "using least memory",
                            100 * kTimeResolution, others(tied, best));
  }
}

// `fitting` are ranked; the curve's ends come from `curve`, every passing policy that fits.
void recommend_knee(BenchResult& r, const std::vector<Point>& fitting, const std::vector<Point>& curve, Point none) {
  // The policies no other beats on both memory and time.
  const MemoryScale memory(fitting);
  std::vector<Point> front;
  for (const auto* p : fitting) {
    bool dominated = false;
    for (const auto* q : fitting) dominated = dominated || memory.dominates(q, p);
    if (!dominated) front.push_back(p);
  }
  if (front.empty()) front = fitting;
  std::sort(front.begin(), front.end(), [](Point a, Point b) { return a->time_ratio < b->time_ratio; });
  if (front.size() < 3) {
    // Two points or one: take the smaller one when it saves at least 10% within the overhead bound.
    const auto* pick = front.front();
    const auto* small = front.back();
    if (small != pick && none && small->time_ratio - 1.0 <= r.max_overhead && total_bytes(pick) - total_bytes(small) >= 0.10 * total_bytes(pick)) {
      r.reason = fmt::format("saves {:.0f}% of the step's memory for +{:.0f}% time", 100 * (1 - total_bytes(small) / total_bytes(pick)),
                             100 * (small->time_ratio - 1.0));
      pick = small;
    } else {
      r.reason = "no policy saves enough memory to pay for its time";
    }
    r.recommendation = pick->policy;
    return;
  }
  // Normalised, the front runs from (0, 1) (fastest) to (1, 0) (smallest); the knee lies furthest
  // below the line between them: the lowest tn + mn. A policy whose time is the knee's within the
  // resolution ties with it, and memory decides.
  // The curve's ends are the fastest and the smallest policy measured, even where the resolution
  // took one off the front (the smallest, when the next saves nearly as much and runs faster).
  auto by_time = [](Point a, Point b) { return std::make_pair(a->time_ratio, total_bytes(a)) < std::make_pair(b->time_ratio, total_bytes(b)); };
  auto by_memory = [](Point a, Point b) { return std::make_pair(total_bytes(a), a->time_ratio) < std::make_pair(total_bytes(b), b->time_ratio); };
  const auto* fastest = *std::min_element(curve.begin(), curve.end(), by_time);
  const auto* smallest = *std::min_element(curve.begin(), curve.end(), by_memory);
  const double t0 = fastest->time_ratio, t1 = smallest->time_ratio;
  const double m0 = total_bytes(smallest), m1 = total_bytes(fastest);
  const double span = t1 > t0 ? t1 - t0 : 1.0;
  auto score = [&](Point p) { return (p->time_ratio - t0) / span + (m1 > m0 ? (total_bytes(p) - m0) / (m1 - m0) : 0.0); };
  const auto* best = *std::min_element(front.begin(), front.end(), [&](Point a, Point b) { return score(a) < score(b); });
  std::vector<Point> tied;
  for (const auto* p : front) {
    if (same_time(p, best)) tied.push_back(p);
  }
  const auto* pick = *std::min_element(tied.begin(), tied.end(), [](Point a, Point b) { return total_bytes(a) < total_bytes(b); });
  r.reason = "the knee of the memory-time curve: the most memory saved per unit of time spent";
  if (tied.size() > 1) {
    r.reason += fmt::format("; its time is within {:.0f}% of {}'s (not ranked: run to run, times move that much), so the one "
                            "using least memory",
                            100 * kTimeResolution, others(tied, pick));
  }
  r.recommendation = pick->policy;
}

// The measured policies that pass their checks (or have nothing to check); the others are shown
// with why they are not ranked.
std::vector<PolicyBench*> passing_policies(BenchResult& r) {
  std::vector<PolicyBench*> passing;
  for (auto& p : r.policies) {
    p.ranked = false;
    p.not_ranked.clear();
    if (p.measurement.step_seconds.empty()) continue;
    if (p.checks && p.checks != Verdict::kPass) {
      p.not_ranked = fmt::format("{} the checks: {}", p.checks == Verdict::kFail ? "fails" : "could not pass",
                                 fmt::join(p.check_failures, "; "));
      r.warnings.push_back(fmt::format("{}: not ranked: its checkpointed step {}; the findings: {} --policy {}", p.policy,
                                       p.not_ranked, r.check_command.empty() ? "ckcheck run" : r.check_command,
                                       p.policy));
      continue;
    }
    passing.push_back(&p);
  }
  return passing;
}

}  // namespace

void recommend(BenchResult& r) {
  const std::vector<PolicyBench*> passing = passing_policies(r);
  if (passing.empty()) {
    r.reason = "no policy could be measured";
    return;
  }
  std::vector<Point> measured(passing.begin(), passing.end());
  Point none = nullptr;
  for (const auto* p : measured) {
    if (p->checkpointed.empty() && p->policy == "none") none = p;
  }
  if (!r.too_noisy) warn_too_fine(r, measured);
  warn_not_effective(r, measured, none);
  warn_budget_not_monotone(r, measured);
  // One policy stands for each memory class: in the order of how much they recompute (known from
  // the plans), a policy whose peak is within the resolution of one already standing is not ranked.
  const MemoryScale memory(measured);
  std::vector<PolicyBench*> order = passing;
  std::stable_sort(order.begin(), order.end(), [](Point a, Point b) { return recompute_key(a) < recompute_key(b); });
  std::vector<Point> standing;
  for (auto* p : order) {
    const auto it = std::find_if(standing.begin(), standing.end(), [&](Point q) {
      return std::abs(total_bytes(p) - total_bytes(q)) <= memory.tolerance;
    });
    if (it == standing.end()) {
      p->ranked = true;
      standing.push_back(p);
    } else {
      p->not_ranked = fmt::format("its peak is within {:.0f}% of {}'s, which recomputes less", 100 * kMemoryResolution,
                                  (*it)->policy);
    }
  }
  std::vector<Point> ranked, fitting, curve;
  for (const auto* p : passing) {  // in the order measured
    if (p->fits) curve.push_back(p);
    if (!p->ranked) continue;
    ranked.push_back(p);
    if (p->fits) fitting.push_back(p);
  }
  if (r.memory_budget_bytes >= 0) return recommend_within_budget(r, measured, fitting);
  if (r.too_noisy) {
    const auto* smallest = *std::min_element(measured.begin(), measured.end(), [](Point a, Point b) { return total_bytes(a) < total_bytes(b); });
    r.reason = fmt::format("no recommendation: the machine was too noisy for a time verdict; on memory alone {} uses the least ({})",
                           smallest->policy, format_bytes(total_bytes(smallest)));
    return;
  }
  if (fitting.empty()) return recommend_knee(r, ranked, measured, none);
  recommend_knee(r, fitting, curve, none);
}

void withhold_imprecise_times(BenchResult& result) {
  if (result.too_noisy) return;
  std::vector<std::string> wide;
  for (const auto& p : result.policies) {
    if (p.measurement.step_seconds.empty()) continue;
    const double half = (p.time_ratio_high - p.time_ratio_low) / 2;
    if (half > kIntervalLimit) {
      wide.push_back(fmt::format("{} ({:.2f}x, {:.2f}-{:.2f})", p.policy, p.time_ratio, p.time_ratio_low, p.time_ratio_high));
    }
  }
  if (wide.empty()) return;
  result.too_noisy = true;
  result.warnings.push_back(fmt::format(
      "the time ratios of {} are known only to more than +-{:.0f}% of none's step after {} rounds, the widest "
      "interval at which the ranking stays stable: the machine is too noisy for a time verdict (other processes?); "
      "only the memory figures stand",
      fmt::join(wide, ", "), 100 * kIntervalLimit, result.rounds));
}

const PolicyBench* measured_none(const BenchResult& r) {
  const PolicyBench* none = nullptr;
  for (const auto& p : r.policies) {
    if (p.policy == "none" && !p.measurement.step_seconds.empty()) none = &p;
  }
  return none;
}

double peak_ratio(const PolicyBench& p, const PolicyBench& none) {
  return none.measurement.peak_bytes > 0
             ? static_cast<double>(p.measurement.peak_bytes) / static_cast<double>(none.measurement.peak_bytes)
             : 1.0;
}

}  // namespace ckcheck
