#include "harness/runner/profile.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "harness/runner/trace.h"
#include "harness/support/memory.h"
#include "harness/support/text.h"

namespace ckcheck {
namespace {

using torch::Tensor;

// Bytes of the distinct storages among `ts`, leaving out those in `skip`.
int64_t distinct_bytes(const std::vector<Tensor>& ts, const std::set<const void*>& skip = {}) {
  std::map<const void*, int64_t> storages;
  for (const auto& t : ts) {
    if (!t.defined() || !t.has_storage()) continue;
    const void* key = t.storage().data();
    if (skip.count(key)) continue;
    auto& b = storages[key];
    b = std::max(b, static_cast<int64_t>(t.storage().nbytes()));
  }
  int64_t total = 0;
  for (const auto& [key, b] : storages) total += b;
  return total;
}

std::set<const void*> storages_of(const std::vector<Tensor>& ts) {
  std::set<const void*> out;
  for (const auto& t : ts) {
    if (t.defined() && t.has_storage()) out.insert(t.storage().data());
  }
  return out;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Calls every site plainly, or checkpoints every candidate (`checkpoint`), and watches the
// outermost candidates: it splits the step into stretches (before the sites, each site's forward,
// after it, each site's backward) and keeps each stretch's peak and duration, reading the meter's
// peak and starting a new one at every boundary.
class ProfilingSiteRunner : public SiteRunner, public StepWatch {
 public:
  ProfilingSiteRunner(const std::vector<std::string>& sites, const torch::Device& device, Model* checkpoint,
                      CheckpointOptions options, std::set<std::string> checkpointed = {})
      : meter_(MemoryMeter::of(device)), device_(device), checkpoint_(checkpoint), options_(std::move(options)),
        checkpointed_(std::move(checkpointed)), seconds_(sites.size()) {
    for (size_t i = 0; i < sites.size(); ++i) {
      index_.emplace(sites[i], i);
      costs_.push_back({sites[i]});
    }
  }

  using SiteRunner::call;

  std::vector<Tensor> call(const std::string& site, const SiteFn& fn, const std::vector<Tensor>& inputs) override {
    const auto it = index_.find(site);
    if (depth_ > 0 || it == index_.end()) return fn(inputs);
    const size_t i = it->second;
    open("forward of " + site, i, std::nullopt);
    const int64_t entry = meter_.current_bytes();
    std::vector<Tensor> outs;
    const double seconds = time_on_device(device_, [&] {
      if (!checkpoint_ || !checkpointed_.count(site)) {
        outs = inside(fn, inputs);
        return;
      }
      auto o = options_;
      o.name(site);
      // Inside the unit every site runs plainly, in the forward and in the recompute.
      outs = checkpoint_->checkpoint_unit([this, fn](const std::vector<Tensor>& xs) { return inside(fn, xs); }, inputs, o);
    });
    const int64_t exit = meter_.current_bytes();
    const int64_t forward_peak = meter_.peak_bytes() - entry;
    open("after " + site, i + 1, std::nullopt);
    if (!step_seen_[i]) {
      auto& c = costs_[i];
      c.input_bytes = c.output_bytes = c.kept_bytes = c.forward_peak_bytes = 0;
    }
    auto& c = costs_[i];
    step_seen_[i] = true;
    const int64_t out_bytes = distinct_bytes(outs, storages_of(inputs));
    c.input_bytes += distinct_bytes(inputs);
    c.output_bytes += out_bytes;
    c.kept_bytes += std::max<int64_t>(0, exit - entry - out_bytes);
    c.forward_peak_bytes = std::max(c.forward_peak_bytes, forward_peak);
    if (measured_) seconds_[i].push_back(seconds);
    // The site's backward begins when the gradient of one of its outputs is complete.
    for (auto& o : outs) {
      if (!o.defined() || !o.requires_grad()) continue;
      o.register_hook([this, i, site, step = step_](const Tensor&) {
        if (step != step_ || backward_seen_[i]) return;
        backward_seen_[i] = true;
        open("backward of " + site, i, i);
      });
    }
    return outs;
  }

  // A model that checkpoints itself (its own switch) turns it on when the step checkpoints.
  bool checkpointing() const override { return checkpoint_ && !checkpointed_.empty(); }
  std::vector<std::string> checkpointed_sites() const override {
    return checkpoint_ ? std::vector<std::string>(checkpointed_.begin(), checkpointed_.end()) : std::vector<std::string>();
  }

  void step_begins(bool measured, int64_t bytes) override {
    ++step_;
    measured_ = measured;
    start_ = bytes;
    regions_.clear();
    step_seen_.assign(costs_.size(), false);
    backward_seen_.assign(costs_.size(), false);
    regions_.push_back({"before the sites", 0, 0.0, 0, std::nullopt});
    opened_ = now();
  }

  int64_t step_ends() override {
    close();
    int64_t peak = 0;
    for (const auto& r : regions_) peak = std::max(peak, r.peak_bytes);
    return peak;
  }

  const std::vector<SiteCost>& costs() const { return costs_; }
  const std::vector<PeakRegion>& regions() const { return regions_; }
  std::vector<double> seconds(size_t i) const { return seconds_[i]; }

 private:
  // Runs a candidate's function; the sites it calls run plainly, unwatched.
  std::vector<Tensor> inside(const SiteFn& fn, const std::vector<Tensor>& xs) {
    ++depth_;
    try {
      auto out = fn(xs);
      --depth_;
      return out;
    } catch (...) {
      --depth_;
      throw;
    }
  }

  void close() {
    if (regions_.empty()) return;
    regions_.back().peak_bytes = std::max<int64_t>(0, meter_.peak_bytes() - start_);
    regions_.back().seconds = now() - opened_;
    meter_.reset_peak();
  }

  void open(const std::string& where, size_t holding, std::optional<size_t> recomputes) {
    close();
    regions_.push_back({where, 0, 0.0, holding, recomputes});
    opened_ = now();
  }

  MemoryMeter& meter_;
  torch::Device device_;
  Model* checkpoint_;
  CheckpointOptions options_;
  std::set<std::string> checkpointed_;
  double opened_ = 0.0;
  std::map<std::string, size_t> index_;
  std::vector<SiteCost> costs_;
  std::vector<std::vector<double>> seconds_;
  std::vector<PeakRegion> regions_;
  std::vector<bool> step_seen_, backward_seen_;
  int64_t start_ = 0;
  int64_t step_ = 0;
  bool measured_ = false;
  int depth_ = 0;
};

// Calls every site plainly and tells the tracer which outermost candidate is running.
class TracingSiteRunner : public SiteRunner {
 public:
  TracingSiteRunner(const std::vector<SiteCost>& sites, OpTracer& tracer) : tracer_(tracer) {
    for (const auto& s : sites) candidates_.insert(s.site);
  }
  using SiteRunner::call;
  std::vector<Tensor> call(const std::string& site, const SiteFn& fn, const std::vector<Tensor>& inputs) override {
    if (depth_ > 0 || !candidates_.count(site)) return fn(inputs);
    tracer_.push_site(site);
    ++depth_;
    struct Pop {
      TracingSiteRunner* r;
      ~Pop() {
        --r->depth_;
        r->tracer_.pop_site();
      }
    } pop{this};
    return fn(inputs);
  }

 private:
  OpTracer& tracer_;
  std::set<std::string> candidates_;
  int depth_ = 0;
};

// Ops that make a tensor from no activation (empty, zeros_like, arange, ...): cheap to run again,
// often filled in place afterwards, so a selective plan never saves them.
bool is_creation_op(const std::string& name) {
  static const std::set<std::string> ops = {
      "aten::empty",     "aten::empty_like", "aten::empty_strided", "aten::zeros",    "aten::zeros_like",
      "aten::ones",      "aten::ones_like",  "aten::full",          "aten::full_like", "aten::arange",
      "aten::scalar_tensor", "aten::new_empty", "aten::new_empty_strided", "aten::new_zeros", "aten::new_ones",
      "aten::new_full",  "aten::eye",        "aten::linspace",      "aten::lift_fresh_copy"};
  return ops.count(name) > 0;
}

}  // namespace

int64_t OpClassCost::bytes() const {
  int64_t b = 0;
  for (auto x : site_bytes) b += x;
  return b;
}

double OpClassCost::seconds() const {
  double t = 0.0;
  for (auto x : site_seconds) t += x;
  return t;
}

namespace {

// "aten::mm" -> "aten.mm"; "" for a name without a namespace.
std::string op_class_name(const std::string& name) {
  const auto colon = name.find("::");
  if (colon == std::string::npos) return "";
  return name.substr(0, colon) + "." + name.substr(colon + 2);
}

// The traced forward's op classes per site, summed over the steps, and each site's traced time.
// The ops autograd sees: the outermost ops that are not decomposed above it. `counted_at` holds,
// per nesting depth, whether an op there (or one it runs inside) is already counted.
std::map<std::string, OpClassCost> tally_op_classes(const std::vector<OpRecord>& records,
                                                    const std::map<std::string, size_t>& index, size_t num_sites,
                                                    std::vector<double>& traced) {
  std::map<std::string, OpClassCost> classes;
  std::vector<bool> counted_at;
  for (const auto& r : records) {
    counted_at.resize(static_cast<size_t>(r.depth) + 1);
    const bool inside_counted = r.depth > 0 && counted_at[static_cast<size_t>(r.depth) - 1];
    counted_at[static_cast<size_t>(r.depth)] = inside_counted || !r.composite;
    if (inside_counted || r.composite || r.phase != Phase::kForward) continue;
    const auto site = index.find(r.site);
    if (site == index.end()) continue;
    traced[site->second] += r.seconds;
    const bool in_place = !r.name.empty() && r.name.back() == '_';
    if (in_place || r.output_bytes <= 0 || is_creation_op(r.name)) continue;
    const std::string op = op_class_name(r.name);
    if (op.empty()) continue;
    auto& c = classes[op];
    if (c.op.empty()) {
      c.op = op;
      c.site_bytes.assign(num_sites, 0);
      c.site_seconds.assign(num_sites, 0.0);
    }
    ++c.calls;
    c.site_bytes[site->second] += r.output_bytes;
    c.site_seconds[site->second] += r.seconds;
  }
  return classes;
}

}  // namespace

void profile_op_classes(Runner& runner, StepProfile& p, int64_t warmup, int64_t steps) {
  steps = std::max<int64_t>(1, steps);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < p.sites.size(); ++i) index.emplace(p.sites[i].site, i);
  std::vector<OpRecord> records;
  {
    PlainSiteRunner plain;
    if (warmup > 0) runner.measure_with(plain, warmup, 0, nullptr);
    OpTracer tracer(TraceLevel::kDtypes);
    TracingSiteRunner sites(p.sites, tracer);
    const auto m = runner.measure_with(sites, 0, steps, nullptr);
    records = tracer.take();
    if (!m.error.empty()) {
      p.op_classes_note = "the traced plain step threw: " + first_line(m.error);
      return;
    }
  }
  std::vector<double> traced(p.sites.size(), 0.0);
  auto classes = tally_op_classes(records, index, p.sites.size(), traced);
  // Per step; the tracer's own cost taken out by scaling to the untraced forward.
  std::vector<double> scale(p.sites.size(), 1.0 / static_cast<double>(steps));
  for (size_t i = 0; i < p.sites.size(); ++i) {
    const double per_step = traced[i] / static_cast<double>(steps);
    if (per_step > p.sites[i].forward_seconds && per_step > 0.0) scale[i] = p.sites[i].forward_seconds / traced[i];
  }
  p.op_classes.clear();
  for (auto& [op, c] : classes) {
    c.calls /= steps;
    for (size_t i = 0; i < p.sites.size(); ++i) {
      c.site_bytes[i] /= steps;
      c.site_seconds[i] *= scale[i];
    }
    p.op_classes.push_back(std::move(c));
  }
  std::sort(p.op_classes.begin(), p.op_classes.end(), [](const OpClassCost& a, const OpClassCost& b) {
    if (a.seconds() != b.seconds()) return a.seconds() > b.seconds();
    return a.op < b.op;
  });
}

namespace {

// Every site checkpointed; a site where the checkpointed step throws is left plain and measured
// again without it (its figures are then estimated). `checkpointed` keeps the sites that were.
std::unique_ptr<ProfilingSiteRunner> measure_checkpointed(Runner& runner, const std::vector<std::string>& sites,
                                                          int64_t warmup, int64_t steps,
                                                          std::set<std::string>& checkpointed, StepProfile& p) {
  const auto& device = runner.config().device;
  std::unique_ptr<ProfilingSiteRunner> all;
  while (!checkpointed.empty()) {
    all = std::make_unique<ProfilingSiteRunner>(sites, device, &runner.model(), runner.config().checkpoint.options(), checkpointed);
    const auto c = runner.measure_with(*all, warmup, steps, all.get());
    if (c.error.empty()) break;
    std::string named;
    for (const auto& s : checkpointed) {
      if (names_site(c.error, s)) named = s;
    }
    if (p.calibration_note.empty()) p.calibration_note = "the step with them checkpointed threw: " + first_line(c.error);
    if (named.empty()) {
      checkpointed.clear();
    } else {
      checkpointed.erase(named);
    }
    all.reset();
  }
  for (const auto& s : sites) {
    if (!checkpointed.count(s)) p.uncalibrated.push_back(s);
  }
  if (!all) all = std::make_unique<ProfilingSiteRunner>(sites, device, nullptr, CheckpointOptions{});
  return all;
}

// The backward peak of each site (the region that recomputes it).
std::vector<std::optional<int64_t>> backward_peaks(const std::vector<PeakRegion>& regions, size_t num_sites) {
  std::vector<std::optional<int64_t>> out(num_sites);
  for (const auto& r : regions) {
    if (r.recomputes) out[*r.recomputes] = r.peak_bytes;
  }
  return out;
}

// Each site's forward time, what a checkpoint there frees and what its recompute adds.
void site_figures(StepProfile& p, const ProfilingSiteRunner& plain, const ProfilingSiteRunner& all,
                  const std::set<std::string>& checkpointed) {
  const auto plain_backward = backward_peaks(p.regions, p.sites.size());
  const auto checkpointed_backward = backward_peaks(all.regions(), p.sites.size());
  int64_t freed_before = 0;
  for (size_t i = 0; i < p.sites.size(); ++i) {
    auto& s = p.sites[i];
    s.forward_seconds = median(plain.seconds(i));
    // Estimates, where the checkpoint at the site could not be measured.
    s.recompute_extra_bytes = s.output_bytes;
    // A recompute runs the site's forward again: its plain forward time, one timing per step (the
    // difference of the checkpointed and plain stretches is four timings, and noise swamps it on a
    // loaded machine).
    s.recompute_seconds = s.forward_seconds;
    if (!checkpointed.count(s.site)) continue;
    const auto& k = all.costs()[i];
    // What the checkpointed forward still keeps (inputs it saves, RNG state) is not freed.
    s.kept_bytes = std::max<int64_t>(0, s.kept_bytes - k.kept_bytes);
    if (plain_backward[i] && checkpointed_backward[i]) {
      s.recompute_extra_bytes = std::max<int64_t>(0, *checkpointed_backward[i] - (*plain_backward[i] - freed_before));
    }
    freed_before += s.kept_bytes;  // in the checkpointed step, the sites after it hold that much less
  }
}

}  // namespace

StepProfile profile_sites(Runner& runner, const std::vector<std::string>& sites, int64_t warmup, int64_t steps) {
  const auto& device = runner.config().device;
  ProfilingSiteRunner plain(sites, device, nullptr, {});
  const auto m = runner.measure_with(plain, warmup, steps, &plain);
  StepProfile p;
  p.error = m.error;
  p.baseline_bytes = m.baseline_bytes;
  p.peak_bytes = m.peak_bytes;
  p.step_seconds = median(m.step_seconds);
  p.steps = static_cast<int64_t>(m.step_seconds.size());
  p.sites = plain.costs();
  p.regions = plain.regions();
  if (!p.error.empty()) return p;
  std::set<std::string> checkpointed(sites.begin(), sites.end());
  auto all = measure_checkpointed(runner, sites, warmup, steps, checkpointed, p);
  site_figures(p, plain, *all, checkpointed);
  return p;
}

}  // namespace ckcheck
