#include "harness/support/enum_names.h"
#include "harness/runner/runner.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <limits>
#include <chrono>
#include <map>
#include <set>

#include "harness/support/errors.h"
#include "harness/support/global_state.h"
#include "harness/support/memory.h"
#include "harness/support/phase.h"

namespace ckcheck {

using torch::Tensor;

const char* amp_name(Amp amp) {
  static constexpr EnumName<Amp> kNames[] = {{Amp::kOff, "off"}, {Amp::kBf16, "bf16"}, {Amp::kFp16, "fp16"}};
  return name_in(kNames, amp);
}

Amp parse_amp(const std::string& text) {
  if (text == "off" || text == "none") return Amp::kOff;
  if (text == "bf16" || text == "bfloat16") return Amp::kBf16;
  if (text == "fp16" || text == "float16" || text == "half") return Amp::kFp16;
  throw FieldError("amp", fmt::format("unknown @amp '{}'; valid: off, bf16, fp16", text));
}

const char* schedule_name(Schedule schedule) {
  static constexpr EnumName<Schedule> kNames[] = {
      {Schedule::kSequential, "sequential"}, {Schedule::kInterleaved, "interleaved"}, {Schedule::kReversed, "reversed"}};
  return name_in(kNames, schedule);
}

Schedule parse_schedule(const std::string& text) {
  for (auto s : {Schedule::kSequential, Schedule::kInterleaved, Schedule::kReversed}) {
    if (text == schedule_name(s)) return s;
  }
  throw FieldError("schedule", fmt::format("unknown @schedule '{}'; valid: sequential, interleaved, reversed", text));
}

const TensorRecord* StepRecord::find(const std::string& name, const std::string& kind,
                                     int64_t step) const {
  for (const auto& t : tensors) {
    if (t.name == name && t.kind == kind && t.step == step) return &t;
  }
  return nullptr;
}

namespace {

// run --bench: steps measured after warm-up, per plan (ckcheck bench takes them as options).
constexpr int64_t kBenchWarmup = 1;
constexpr int64_t kBenchSteps = 5;

std::string message_of(const std::exception& e) {
  if (const auto* c10e = dynamic_cast<const c10::Error*>(&e)) {
    std::string m = c10e->what_without_backtrace();
    // c10 appends "Exception raised from ..." on a line of its own.
    const auto cut = m.find("\nException raised from");
    return cut == std::string::npos ? m : m.substr(0, cut);
  }
  return e.what();
}

std::vector<int64_t> versions_of(const std::vector<Tensor>& ts) {
  std::vector<int64_t> v;
  for (const auto& t : ts) v.push_back(static_cast<int64_t>(t._version()));
  return v;
}

using Digests = std::vector<std::pair<std::string, std::string>>;

// The names whose digest changed from `before` to `after`, or that are new.
std::vector<std::string> changed_digests(const Digests& before, const Digests& after) {
  std::vector<std::string> changed;
  for (const auto& [name, digest] : after) {
    const auto it = std::find_if(before.begin(), before.end(), [&](const auto& b) { return b.first == name; });
    if (it == before.end() || it->second != digest) changed.push_back(name);
  }
  return changed;
}

// Collects CallEvidence for every checkpointed call of one step, and tells the tracer where the
// step is.
class EvidenceObserver : public CheckpointObserver {
 public:
  EvidenceObserver(StepRecord& record, bool evidence, OpTracer* tracer, Model* model, const Plan* plan)
      : record_(record), evidence_(evidence), tracer_(tracer), model_(model), plan_(plan) {}

  int64_t step = 1;
  bool watch_rewrites = false;  // StepOptions::watch_rewrites
  bool poison = false;          // RunConfig::poison_rewritten (with watch_rewrites)
  OpTracer* tracer() const { return tracer_; }

  // The micro-batch's backward ended: what --poison overwrote holds its values again, so that the
  // state after the step is the program's own.
  void backward_ended() {
    torch::NoGradGuard no_grad;
    // Last first: a tensor two calls read was kept twice, the second time already NaN.
    for (auto it = poisoned_.rbegin(); it != poisoned_.rend(); ++it) it->first.copy_(it->second);
    poisoned_.clear();
  }

  // The model's forward of a micro-batch ended: under --poison, the state its calls read that the
  // forward had rewritten is overwritten with NaN (after the whole forward: a later unit may read
  // it too), and those calls' marks taken again, so that only the program's own writes count as
  // changes before the recompute.
  void model_forward_ends() {
    if (!evidence_ || !poison) return;
    for (auto& [id, e] : calls_) {
      if (e.state_rewritten.empty() || !e.state_poisoned.empty() || e.recomputed) continue;
      poison_rewritten(e);
    }
    for (auto& [id, e] : calls_) {
      if (!e.state_poisoned.empty() && !e.recomputed) state_at_forward_[id] = state_marks(sites_of_unit(e.site));
    }
  }

  // The model's forward of a micro-batch begins: the state every unit reads, marked, so that each
  // call's forward can tell what the forward wrote before it (CallEvidence::state_rewritten).
  void model_forward_begins() {
    if (!evidence_ || !watch_rewrites || !plan_) return;
    std::vector<std::string> sites;
    for (const auto& unit : plan_->units) sites.insert(sites.end(), unit.begin(), unit.end());
    step_marks_ = state_marks(sites);
  }

  void forward_begin(const CheckpointCall& c, const std::vector<Tensor>& inputs) override {
    at::DisableRecordFunctionGuard quiet;  // the evidence work is not the step's
    if (tracer_) tracer_->push_site(c.site, c.id);
    if (!evidence_) return;
    auto& e = calls_[c.id];
    e.site = c.site;
    e.call = c.id;
    e.step = step;
    e.versions_entry = versions_of(inputs);
    e.inputs_forward = inputs.size();
    e.forward_no_grad = !torch::GradMode::is_enabled();
    for (const auto& x : inputs) e.inputs_require_grad = e.inputs_require_grad || (x.defined() && x.requires_grad());
    for (const auto& x : inputs) entry_prints_[c.id].push_back(fingerprint(x));
    if (model_) variables_before_[c.id] = model_->module_variables();
    if (watch_rewrites && !step_marks_.empty()) note_rewrites(e);
    rng_before_[c.id] = RngState::capture();
    draw_watches_[c.id] = std::make_unique<DrawWatch>(e.forward_draws, &e.forward_collectives);
  }

  void forward_end(const CheckpointCall& c, const std::vector<Tensor>& inputs,
                   const std::vector<Tensor>& outputs) override {
    at::DisableRecordFunctionGuard quiet;  // the evidence work is not the step's
    if (tracer_) tracer_->pop_site();
    if (!evidence_) return;
    draw_watches_.erase(c.id);
    auto& e = calls_[c.id];
    e.versions_exit = versions_of(inputs);
    e.variables_forward = variables_written(c.id);
    const auto rng_after = RngState::capture();
    const auto& before = rng_before_[c.id];
    e.rng_consumed = rng_after != before;
    if (e.rng_consumed) {
      // After the draws: a model that reseeds inside its forward leaves every rank in one state.
      e.rng_print = fingerprint(rng_after.cpu);
      for (const auto& [device, state] : rng_after.cuda) e.rng_print = e.rng_print * 1000003ull + fingerprint(state);
    }
    rng_before_.erase(c.id);
    if (e.rng_consumed) rng_after_forward_[c.id] = rng_after;
    auto& kept = outputs_[c.id];
    for (const auto& o : outputs) kept.push_back(o.defined() ? o.detach().clone() : Tensor());
    state_at_forward_[c.id] = state_marks(sites_of_unit(c.site));
  }

  void recompute_begin(const CheckpointCall& c, const std::vector<Tensor>& inputs,
                       const std::vector<Tensor>& grads) override {
    at::DisableRecordFunctionGuard quiet;  // the evidence work is not the step's
    if (tracer_) {
      tracer_->set_phase(Phase::kRecompute);
      tracer_->push_site(c.site, c.id);
    }
    if (!evidence_) return;
    auto& e = calls_[c.id];
    if (e.recomputed) {
      // Again (a backward that kept the graph, a double backward): the evidence of the first stands.
      output_grads(c, grads);
      return;
    }
    e.recomputed = true;
    if (model_) variables_before_[c.id] = model_->module_variables();
    e.inputs_recompute = inputs.size();
    e.versions_recompute = versions_of(inputs);
    draw_watches_[c.id] = std::make_unique<DrawWatch>(e.recompute_draws, &e.recompute_collectives);
    // State the unit reads (Model::unit_state: its own modules', a shared one's under its first
    // path; a module cannot reach its parent's state other than through its arguments, which are
    // watched above), marked at the forward and now.
    const auto now = state_marks(sites_of_unit(c.site));
    for (const auto& [name, mark] : state_at_forward_[c.id]) {
      auto it = now.find(name);
      if (it != now.end() && it->second == mark) continue;
      const auto plain = state_display_name(name);
      e.state_changed.push_back(plain);
      const auto aliases = model_->state_aliases(name);
      if (!aliases.empty()) e.state_paths[plain] = aliases.size() + 1;
    }
    const auto& prints = entry_prints_[c.id];
    for (size_t i = 0; i < inputs.size(); ++i) {
      e.content_changed.push_back(i < prints.size() && fingerprint(inputs[i]) != prints[i]);
    }
    output_grads(c, grads);
  }

  void output_grads(const CheckpointCall& c, const std::vector<Tensor>& grads) override {
    if (!evidence_) return;
    at::DisableRecordFunctionGuard quiet;
    torch::NoGradGuard no_grad;
    auto& e = calls_[c.id];
    for (const auto& g : grads) {
      if (g.defined() && g.numel() > 0 && g.abs().max().item<double>() != 0.0) e.grad_all_zero = false;
    }
  }

  void recompute_end(const CheckpointCall& c, const std::vector<Tensor>& outputs) override {
    at::DisableRecordFunctionGuard quiet;  // the evidence work is not the step's
    if (tracer_) {
      tracer_->pop_site();
      tracer_->set_phase(Phase::kBackward);
    }
    if (!evidence_) return;
    draw_watches_.erase(c.id);
    auto& e = calls_[c.id];
    const bool again = !e.output_diffs.empty();
    if (!again) {
      e.variables_recompute = variables_written(c.id);
      // The saved tensors handed back, and the list they came from holding others by now.
      if (const auto seen = model_ ? model_->inputs_seen(c.site) : -1; seen >= 0) e.inputs_recompute = seen;
    }
    recompute_ended_.insert(c.id);
    // Whatever the checkpoint (ckcheck's, torch's, the model's own): a recompute that drew the
    // forward's random numbers from the forward's state ends where the forward ended.
    if (auto it = rng_after_forward_.find(c.id); it != rng_after_forward_.end()) {
      const bool replayed = RngState::capture() == it->second;
      e.rng_replayed = again ? e.rng_replayed && replayed : replayed;
    }
    const auto& before = outputs_[c.id];
    for (size_t i = 0; i < outputs.size(); ++i) {
      auto d = compare_tensors(i < before.size() ? before[i] : Tensor(), outputs[i], Tolerance());
      d.name = fmt::format("{} output {}", c.site, i);
      d.kind = "output";
      d.step = e.step;
      // A later recompute adds only what differs: that is evidence; its equal outputs repeat the first's.
      if (!again || !d.equal) e.output_diffs.push_back(d);
    }
  }

  void flush() {
    backward_ended();       // a backward that threw left what --poison overwrote
    draw_watches_.clear();  // a forward or recompute that threw left its watch open
    for (auto& [id, e] : calls_) {
      // A call whose recompute began and never ended did not finish.
      e.recompute_failed = e.recomputed && recompute_ended_.count(id) == 0;
      record_.calls.push_back(std::move(e));
    }
    calls_.clear();
    outputs_.clear();
    recompute_ended_.clear();
    entry_prints_.clear();
    variables_before_.clear();
    rng_after_forward_.clear();
    state_at_forward_.clear();
  }

 private:
  StepRecord& record_;
  bool evidence_;
  OpTracer* tracer_;
  std::map<int64_t, CallEvidence> calls_;
  std::map<int64_t, std::unique_ptr<DrawWatch>> draw_watches_;  // a call's forward or recompute under way
  std::map<int64_t, std::vector<Tensor>> outputs_;  // the forward's, until the step ends
  std::set<int64_t> recompute_ended_;                // calls a recompute of which ended
  std::map<int64_t, Digests> variables_before_;      // module-level variables as the call's forward or recompute began
  std::map<int64_t, std::vector<uint64_t>> entry_prints_;
  std::map<int64_t, RngState> rng_before_;
  std::map<int64_t, RngState> rng_after_forward_;
  Model* model_;
  const Plan* plan_;
  // Each state tensor's identity, version and storage (an engine that swaps a parameter's .data
  // keeps the tensor and its version); a scalar attribute (a fresh 0-d tensor each time) by its
  // value instead.
  using Mark = std::tuple<const void*, int64_t, const void*>;
  std::map<int64_t, std::map<std::string, Mark>> state_at_forward_;

  std::map<std::string, Mark> step_marks_;  // the units' state as the model's forward began
  std::vector<std::pair<Tensor, Tensor>> poisoned_;  // --poison: each tensor overwritten, and its value

  // --poison: the call's rewritten floating-point state overwritten with NaN, in place.
  void poison_rewritten(CallEvidence& e) {
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : model_->unit_state(sites_of_unit(e.site))) {
      const auto plain = state_display_name(name);
      const auto& rewritten = e.state_rewritten;
      if (!t.defined() || !t.is_floating_point() || std::find(rewritten.begin(), rewritten.end(), plain) == rewritten.end()) {
        continue;
      }
      poisoned_.emplace_back(t, t.clone());
      t.fill_(std::numeric_limits<double>::quiet_NaN());
      e.state_poisoned.push_back(plain);
    }
  }

  // The state the call's unit reads that changed since the model's forward began.
  void note_rewrites(CallEvidence& e) const {
    for (const auto& [name, mark] : state_marks(sites_of_unit(e.site))) {
      const auto it = step_marks_.find(name);
      if (it != step_marks_.end() && it->second != mark) e.state_rewritten.push_back(state_display_name(name));
    }
  }

  // The sites of the unit a checkpoint call stands for, from the plan.
  std::vector<std::string> sites_of_unit(const std::string& label) const {
    if (plan_) {
      for (const auto& unit : plan_->units) {
        if (Plan::unit_label(unit) == label) return unit;
      }
    }
    return {label};
  }

  // The module-level variables of the model's code that call `id`'s forward or recompute, begun
  // with variables_before_ taken, wrote (appended to, counted up, rebound).
  std::vector<std::string> variables_written(int64_t id) {
    const auto it = variables_before_.find(id);
    if (!model_ || it == variables_before_.end()) return {};
    auto written = changed_digests(it->second, model_->module_variables());
    variables_before_.erase(it);
    return written;
  }

  // The parameters and state the unit of `sites` reads, each by identity and version.
  std::map<std::string, Mark> state_marks(const std::vector<std::string>& sites) const {
    std::map<std::string, Mark> marks;
    if (!model_) return marks;
    auto mark = [&](const std::string& name, const Tensor& t) {
      const auto kind = model_->state_kind_of(name);
      if (!t.defined()) {
        marks[name] = {nullptr, -1, nullptr};
      } else if (kind == state_kind::kScalarAttribute || kind == state_kind::kMode || kind == state_kind::kExtra) {
        // Made afresh by each state_tensors() call (a number's 0-d tensor, a generator's state):
        // compared by content.
        marks[name] = {nullptr, static_cast<int64_t>(fingerprint(t)), nullptr};
      } else {
        marks[name] = {t.unsafeGetTensorImpl(), static_cast<int64_t>(t._version()),
                       t.has_storage() ? t.storage().data() : nullptr};
      }
    };
    for (const auto& [name, t] : model_->unit_state(sites)) mark(name, t);
    return marks;
  }
};

// Calls each site plainly, except the plan's units, which go to run_unit() -- a single site or,
// from chain(), a run of consecutive sites. A site inside a unit always runs plainly (the unit
// covers it), in the forward and in a recompute.
class UnitSiteRunner : public SiteRunner {
 public:
  explicit UnitSiteRunner(const Plan* plan) {
    if (!plan) return;
    for (const auto& u : plan->units) {
      if (u.size() == 1) {
        single_.insert(u[0]);
      } else {
        segments_[u.front()] = u;
      }
    }
  }

  using SiteRunner::call;

  std::vector<Tensor> call(const std::string& site, const SiteFn& fn,
                           const std::vector<Tensor>& inputs) override {
    auto wrapped = wrap_site(site, fn);
    if (depth_ == 0 && single_.count(site)) return run_unit({site}, inside(wrapped), inputs);
    return wrapped(inputs);
  }

  Tensor chain(const std::vector<std::string>& sites, const std::vector<TensorFn>& fns,
               const Tensor& x) override {
    Tensor h = x;
    for (size_t i = 0; i < fns.size();) {
      auto seg = depth_ == 0 ? segments_.find(sites[i]) : segments_.end();
      if (seg == segments_.end()) {
        h = call(sites[i], fns[i], h);
        ++i;
        continue;
      }
      const auto& unit = seg->second;
      const size_t end = i + unit.size();
      TORCH_CHECK(end <= fns.size(), "segment ", Plan::unit_label(unit), " runs past the chain");
      SiteFn run = [this, sites, fns, i, end](const std::vector<Tensor>& xs) {
        Tensor y = xs[0];
        for (size_t k = i; k < end; ++k) y = call(sites[k], fns[k], y);
        return std::vector<Tensor>{y};
      };
      h = run_unit(unit, inside(run), {h})[0];
      i = end;
    }
    return h;
  }

 protected:
  /// Runs one unit; `fn` already marks the runner as inside it.
  virtual std::vector<Tensor> run_unit(const std::vector<std::string>& unit, const SiteFn& fn,
                                       const std::vector<Tensor>& inputs) = 0;
  /// Wraps every site's function (to trace it, say); as is by default.
  virtual SiteFn wrap_site(const std::string& site, const SiteFn& fn) { return fn; }

  // Marks the runner as inside a unit while `fn` runs -- in the forward, and in a recompute,
  // which calls the same function again.
  SiteFn inside(const SiteFn& fn) {
    return [this, fn](const std::vector<Tensor>& xs) {
      ++depth_;
      struct Down {
        int& d;
        ~Down() { --d; }
      } down{depth_};
      return fn(xs);
    };
  }

 private:
  std::set<std::string> single_;
  std::map<std::string, std::vector<std::string>> segments_;
  int depth_ = 0;
};

// Checkpoints the plan's units, with the run's checkpoint options.
class PlanSiteRunner : public UnitSiteRunner {
 public:
  PlanSiteRunner(const Plan* plan, CheckpointOptions base, Model& model, bool restore_buffers,
                 OpTracer* tracer, Plant* plant = nullptr)
      : UnitSiteRunner(plan), base_(std::move(base)), model_(model), restore_buffers_(restore_buffers), tracer_(tracer),
        plan_(plan), checkpoints_(plan && !plan->units.empty()), plant_(plant) {}

 protected:
  std::vector<Tensor> run_unit(const std::vector<std::string>& unit, const SiteFn& fn,
                               const std::vector<Tensor>& inputs) override {
    auto o = base_;
    o.name(Plan::unit_label(unit));
    if (restore_buffers_) {
      std::vector<Tensor> buffers;
      for (const auto& s : unit) {
        for (auto& b : model_.site_buffers(s)) buffers.push_back(b);
      }
      o.restore_buffers(buffers);
    }
    return model_.checkpoint_unit(fn, inputs, o);
  }

  bool checkpointing() const override { return checkpoints_; }

  std::optional<double> compiler_budget() const override { return plan_ ? plan_->compiler_budget() : std::nullopt; }

  std::string sac_save() const override { return plan_ ? plan_->sac_save() : std::string(); }

  std::vector<std::string> checkpointed_sites() const override {
    std::vector<std::string> out;
    if (!plan_) return out;
    for (const auto& u : plan_->units) out.insert(out.end(), u.begin(), u.end());
    return out;
  }

  SiteFn wrap_site(const std::string& site, const SiteFn& given) override {
    const SiteFn fn = plant_ && site == plant_->site() ? plant_->wrap(given) : given;
    if (!tracer_) return fn;
    return [this, site, fn](const std::vector<Tensor>& xs) {
      tracer_->push_site(site);
      struct Pop {
        OpTracer* t;
        ~Pop() { t->pop_site(); }
      } pop{tracer_};
      return fn(xs);
    };
  }

 private:
  CheckpointOptions base_;
  Model& model_;
  bool restore_buffers_;
  OpTracer* tracer_;
  const Plan* plan_;
  bool checkpoints_;
  Plant* plant_;
};

// The seeded upstream gradient of an output of these sizes, dtype and device.
Tensor upstream_for(c10::IntArrayRef sizes, const torch::TensorOptions& options, uint64_t seed, int64_t step,
                    size_t index) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ull + step * 101ull + index);
  auto g = torch::randn(sizes, gen, torch::TensorOptions().dtype(torch::kFloat));
  return g.to(options.device(), options.dtype().toScalarType());
}

Tensor upstream_for(const Tensor& out, uint64_t seed, int64_t step, size_t index) {
  return upstream_for(out.sizes(), out.options(), seed, step, index);
}

c10::ScalarType amp_dtype(Amp amp) { return amp == Amp::kFp16 ? torch::kHalf : torch::kBFloat16; }

std::optional<AutocastState> autocast_for(Amp amp, const torch::Device& device) {
  if (amp == Amp::kOff) return std::nullopt;
  auto s = AutocastState::capture();
  if (device.is_cuda()) {
    s.cuda_enabled = true;
    s.cuda_dtype = amp_dtype(amp);
  } else {
    if (amp == Amp::kFp16) {
      throw FieldError("amp", "@amp fp16 is CUDA's autocast; on the CPU use @amp bf16");
    }
    s.cpu_enabled = true;
    s.cpu_dtype = amp_dtype(amp);
  }
  return s;
}

}  // namespace

Runner::Runner(Model& model, RunConfig config) : model_(model), config_(std::move(config)) {
  if (model_.device() != config_.device) model_.to(config_.device);
  start_ = model_.snapshot();
}

Runner::~Runner() {
  try {
    model_.restore(start_);
  } catch (...) {
    // Nothing sensible to do in a destructor; the model is discarded by its owner anyway.
  }
}

namespace {

// The model's forward, under the step's autocast state when it has one.
template <typename Autocast>
std::vector<Tensor> forward_under(const Autocast& autocast, Model& model, const std::vector<Tensor>& xs,
                                  SiteRunner& sites) {
  std::optional<AutocastScope> scope;
  if (autocast) scope.emplace(*autocast);
  return model.forward(xs, sites);
}

// The leaves a step starts from: fresh copies of the inputs, each requiring grad as the model's
// own did (or every floating-point one, when the run asks for input gradients).
std::vector<Tensor> leaf_inputs(const std::vector<Tensor>& inputs, bool all_require_grad,
                                std::optional<c10::ScalarType> dtype = std::nullopt) {
  std::vector<Tensor> xs;
  for (const auto& x : inputs) {
    auto leaf = dtype && x.defined() && x.is_floating_point() ? x.detach().to(*dtype) : x.detach().clone();
    const bool wants = x.requires_grad() || (all_require_grad && x.is_floating_point());
    if (wants && (leaf.is_floating_point() || leaf.is_complex())) leaf.requires_grad_(true);
    xs.push_back(leaf);
  }
  return xs;
}

// The backward's roots and upstream gradients (seeded random tensors, never ones), and the loss
// they stand for: the projection of every floating-point output on its upstream gradient.
struct Upstream {
  std::vector<Tensor> roots, grads;
  Tensor loss;
};

Upstream upstream_of(const std::vector<Tensor>& outs, uint64_t seed, int64_t step, const StepParticipant& part) {
  Upstream u;
  u.loss = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble));
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].defined() || !outs[i].is_floating_point()) continue;
    // This process's rows of the upstream gradient of the whole batch.
    auto global = outs[i].sizes().vec();
    if (!global.empty()) global[0] *= part.batch_multiple();
    Tensor g = part.shard(upstream_for(global, outs[i].options(), seed, step, i));
    // A scalar output is a mean over the batch (as PyTorch's losses reduce by default): the whole
    // batch's is the mean of the ranks', so each rank's upstream gradient is 1/N of it -- and the
    // ranks' gradients sum to the whole batch's, as for outputs with a row per example.
    if (global.empty() && part.batch_multiple() > 1) g = g / static_cast<double>(part.batch_multiple());
    u.loss = u.loss + (outs[i].detach().to(torch::kDouble) * g.to(torch::kDouble)).sum().cpu();
    if (outs[i].requires_grad()) {
      u.roots.push_back(outs[i]);
      u.grads.push_back(g);
    }
  }
  return u;
}

// Gradient hooks on the parameters where data-parallel training registers them: after their
// gradient accumulators (DDP's reducer adds its hooks there), so a hook fires each time autograd
// adds to a parameter's .grad. A tensor hook would also fire for a gradient that
// torch.autograd.grad captures without accumulating it (the inner grad() of a hand-written
// checkpoint), which DDP never sees. Counts the firings, and lets the participant see each
// incoming gradient. Removed when destroyed.
class ParameterHooks {
 public:
  ParameterHooks(const NamedTensors& params, StepParticipant& part, bool count)
      : params_(params), fires_(params.size(), 0), without_gradient_(params.size(), 0) {
    part.begin_backward(params);
    if (!count && !part.watches_gradients()) return;
    for (size_t k = 0; k < params.size(); ++k) {
      // A parameter is a leaf. The tensor holds its accumulator weakly: held here, the accumulator
      // and the hook on it stay the ones the graph reaches until the backward is over.
      if (!params[k].second.requires_grad() || !params[k].second.is_leaf()) continue;
      auto acc = torch::autograd::impl::grad_accumulator(params[k].second);
      const auto key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [k, &part, this](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list& inputs) {
            ++fires_[k];
            if (!inputs.at(0).defined()) ++without_gradient_[k];
            part.gradient_ready(k, inputs.at(0));
            return outputs;
          }));
      hooks_.push_back({std::move(acc), key});
    }
  }
  ~ParameterHooks() {
    for (const auto& [acc, key] : hooks_) acc->del_post_hook(key);
  }
  ParameterHooks(const ParameterHooks&) = delete;
  ParameterHooks& operator=(const ParameterHooks&) = delete;

  void record(StepRecord& record, int64_t step, int64_t micro_batch, const StepParticipant& part) const {
    if (hooks_.empty()) return;
    // An engine that runs hooks of its own (FSDP2 on its shards) counts them itself.
    const auto engine = part.hook_fires();
    const bool own = !(engine && engine->size() == fires_.size());
    const auto& fires = own ? fires_ : *engine;
    for (size_t k = 0; k < params_.size(); ++k) {
      if (params_[k].second.requires_grad()) {
        record.hooks.push_back({params_[k].first, step, fires[k], micro_batch, own ? without_gradient_[k] : 0});
      }
    }
  }

 private:
  const NamedTensors& params_;
  std::vector<int64_t> fires_;
  std::vector<int64_t> without_gradient_;  // of fires_, those in which no gradient arrived
  std::vector<std::pair<c10::intrusive_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
};

Tensor copy_of(const Tensor& t) { return t.defined() ? t.detach().clone() : Tensor(); }

// A micro-batch's part of a record name: "" for the first (and only, without accumulation).
std::string micro_batch_suffix(int64_t micro_batch) {
  return micro_batch == 1 ? "" : fmt::format(" (micro-batch {})", micro_batch);
}

void record_outputs(StepRecord& record, const std::vector<Tensor>& outs, const Tensor& loss, int64_t step,
                    int64_t micro_batch) {
  const auto suffix = micro_batch_suffix(micro_batch);
  record.tensors.push_back({"loss" + suffix, "loss", step, loss});
  for (size_t i = 0; i < outs.size(); ++i) {
    record.tensors.push_back({fmt::format("output[{}]{}", i, suffix), "output", step, copy_of(outs[i]),
                              outs[i].defined() && outs[i].requires_grad()});
  }
}

// The input gradients of a micro-batch, kept until the step's parameter gradients are recorded.
void keep_input_grads(std::vector<TensorRecord>& kept, const std::vector<Tensor>& xs, int64_t step, int64_t micro_batch) {
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!xs[i].requires_grad()) continue;
    kept.push_back({fmt::format("input[{}]{}", i, micro_batch_suffix(micro_batch)), "input-grad", step, copy_of(xs[i].grad())});
  }
}

// Parameter gradients as they stand after a micro-batch that is not the step's last.
void record_partial_grads(StepRecord& record, const NamedTensors& params, int64_t step, int64_t micro_batch) {
  for (const auto& [name, p] : params) {
    TensorRecord r{fmt::format("{} after micro-batch {}", name, micro_batch), kPartialGradKind, step, copy_of(p.grad())};
    r.parameter = name;
    r.micro_batch = micro_batch;
    record.tensors.push_back(std::move(r));
  }
}

// Each parameter's version counter as a step begins: a parameter the step changes in place (a
// step count kept as an untrained parameter, weights renormalised in the forward) is state.
std::vector<int64_t> parameter_versions(const NamedTensors& params) {
  std::vector<int64_t> v;
  for (const auto& [name, p] : params) v.push_back(static_cast<int64_t>(p._version()));
  return v;
}

// Parameter gradients (summed over the micro-batches), input gradients, then the model's state
// (buffers, attributes, extra state, and the value of every parameter the step changed in place,
// judged by its version counter since `versions`): the rest of a parameter is covered by its
// gradient.
void record_gradients_and_state(StepRecord& record, Model& model, const NamedTensors& params,
                                std::vector<TensorRecord>& input_grads, int64_t step,
                                const std::vector<int64_t>& versions) {
  for (const auto& [name, p] : params) record.tensors.push_back({name, "param-grad", step, copy_of(p.grad())});
  for (size_t k = 0; k < params.size() && k < versions.size(); ++k) {
    const auto& p = params[k].second;
    if (static_cast<int64_t>(p._version()) != versions[k]) {
      record.tensors.push_back({params[k].first, state_kind::kParameter, step, copy_of(p)});
    }
  }
  for (auto& t : input_grads) record.tensors.push_back(std::move(t));
  input_grads.clear();
  for (const auto& [name, b] : model.state_tensors()) {
    record.tensors.push_back({name, model.state_kind_of(name), step, copy_of(b)});
  }
}

// The SGD update between steps.
void sgd_update(const NamedTensors& params, double lr) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    if (p.grad().defined()) p.sub_(p.grad(), lr);
  }
}

// Op names, dtypes and autocast state per checkpointed call, from the trace (autocast check).
void attach_op_evidence(StepRecord& record) {
  std::map<int64_t, CallEvidence*> by_call;
  for (auto& c : record.calls) by_call[c.call] = &c;
  // The ops the site calls itself, not the kernels they call in turn: the outermost operators
  // ("ns::op") of each call's forward and of its recompute. A checkpoint may run the forward inside
  // a recorded autograd Function (PyTorch's reentrant CheckpointFunction, no "::"), one level deeper
  // than the recompute, which the backward runs.
  auto is_operator = [](const OpRecord& op) { return op.name.find("::") != std::string::npos; };
  std::map<std::pair<int64_t, int>, int64_t> outermost;
  for (const auto& op : record.ops) {
    if (op.phase == Phase::kBackward || !is_operator(op) || !by_call.count(op.call)) continue;
    const auto key = std::make_pair(op.call, static_cast<int>(op.phase));
    const auto it = outermost.find(key);
    if (it == outermost.end() || op.depth < it->second) outermost[key] = op.depth;
  }
  for (const auto& op : record.ops) {
    auto it = by_call.find(op.call);
    if (it == by_call.end() || op.phase == Phase::kBackward || !is_operator(op)) continue;
    auto& e = *it->second;
    const std::string dtype = op.dtypes.empty() ? "-" : fmt::format("{}", fmt::join(op.dtypes, ","));
    const bool forward = op.phase == Phase::kForward;
    if (std::any_of(op.dtypes.begin(), op.dtypes.end(), is_reduced_precision)) {
      (forward ? e.forward_precision_ops : e.recompute_precision_ops).push_back(op.name + " -> " + dtype);
    }
    if (op.depth != outermost[std::make_pair(op.call, static_cast<int>(op.phase))]) continue;
    (forward ? e.forward_ops : e.recompute_ops).push_back(op.name);
    (forward ? e.forward_dtypes : e.recompute_dtypes).push_back(dtype);
    (forward ? e.forward_autocast : e.recompute_autocast).push_back(op.autocast);
  }
}

// A run's start: the model's start state, the seeds, and the first micro-batch's inputs. Each
// rank of a data-parallel run draws its own random stream (its own dropout masks), as training
// seeded per rank does, and takes its shard of the batch; parameters and the global batch come
// from the shared seed.
std::vector<Tensor> start_run(Model& model, const ModelState& start, uint64_t seed, const StepParticipant& part,
                              StepRecord& record) {
  model.restore(start);
  seed_all(seed + part.seed_offset());
  record.rng_start = fingerprint(RngState::capture().cpu);
  auto inputs = model.make_inputs(seed);
  for (auto& x : inputs) x = part.shard(x);
  return inputs;
}

// The step's participant: data parallelism when the run has it and the step uses it, else none.
StepParticipant& participant_of(const RunConfig& config, const StepOptions& options) {
  static StepParticipant alone;
  if (options.data_parallel && config.data_parallel) return *config.data_parallel;
  return alone;
}

// The participant's part in a run of steps, ended on every path.
class ParticipantRun {
 public:
  explicit ParticipantRun(StepParticipant& part) : part_(part) { part_.begin_run(); }
  ~ParticipantRun() {
    try {
      part_.end_run();
    } catch (...) {  // the run's own error, if any, is the one to report
    }
  }
  ParticipantRun(const ParticipantRun&) = delete;
  ParticipantRun& operator=(const ParticipantRun&) = delete;

 private:
  StepParticipant& part_;
};

// A planted auxiliary loss (selftest): each term with a graph joins the backward's roots, as the
// model's own loss would add it; a term made in a forward run without autograd has none to join.
void add_planted_terms(Upstream& up, Plant& plant) {
  for (auto& term : plant.take_aux()) {
    if (!term.requires_grad()) continue;
    up.grads.push_back(torch::ones_like(term));
    up.roots.push_back(std::move(term));
  }
}

// A planted counter (selftest) is the site's state: compared after the step as a buffer is.
void record_planted_state(StepRecord& record, const Plant& plant, int64_t step) {
  if (const auto state = plant.state()) {
    record.tensors.push_back({state->first, state_kind::kBuffer, step, state->second});
  }
}

// The checkpoint's protections: the step's own, or the run's.
CheckpointOptions checkpoint_options(const RunConfig& config, const StepOptions& options = {}) {
  return options.checkpoint.value_or(config.checkpoint).options();
}

// The steps of one Runner::run, micro-batch by micro-batch, recorded into `record`. Bookkeeping
// runs with RecordFunction off (`quiet_`); the model's forward and backward with it on.
class StepRun {
 public:
  StepRun(Model& model, const RunConfig& config, const StepOptions& options, StepRecord& record, SiteRunner& sites,
          EvidenceObserver& observer)
      : model_(model), config_(config), options_(options), record_(record), sites_(sites), observer_(observer),
        part_(participant_of(config, options)), tp_(observer.tracer()), plant_(config.plant.get()),
        autocast_(autocast_for(options.amp.value_or(config.amp), config.device)),
        schedule_(options.schedule.value_or(config.schedule)),
        micro_batches_(schedule_ == Schedule::kSequential ? config.accumulate : std::max<int64_t>(config.accumulate, 2)) {}

  void run(const ModelState& start) {
    quiet_.emplace();
    const ParticipantRun taking_part(part_);
    const auto inputs = start_run(model_, start, config_.seed, part_, record_);
    if (plant_) plant_->begin_run(model_, config_.seed);
    params_ = model_.named_parameters();
    for (int64_t step = 1; step <= config_.steps; ++step) run_step(inputs, step);
  }

 private:
  // One process on the whole batch beside data-parallel ranks: its gradient is the ranks' sum,
  // world_size times their average, so the same update takes a step world_size times smaller.
  double learning_rate() const {
    return !options_.data_parallel && config_.data_parallel
               ? config_.lr / static_cast<double>(config_.data_parallel->world_size())
               : config_.lr;
  }

  void run_step(const std::vector<Tensor>& inputs, int64_t step) {
    observer_.step = step;
    for (const auto& [name, p] : params_) p.mutable_grad() = Tensor();
    const auto versions = parameter_versions(params_);
    if (schedule_ == Schedule::kSequential) {
      for (int64_t mb = 1; mb <= micro_batches_; ++mb) backward(forward(inputs, step, mb));
    } else {
      // Every forward first, each micro-batch's graph held until its backward.
      std::vector<MicroBatch> pending;
      for (int64_t mb = 1; mb <= micro_batches_; ++mb) pending.push_back(forward(inputs, step, mb));
      if (schedule_ == Schedule::kReversed) std::reverse(pending.begin(), pending.end());
      for (size_t k = 0; k < pending.size(); ++k) backward(std::move(pending[k]), k + 1 < pending.size());
    }
    part_.end_step(params_);
    observer_.flush();
    record_gradients_and_state(record_, model_, params_, input_grads_, step, versions);
    if (plant_) record_planted_state(record_, *plant_, step);
    if (step < config_.steps) sgd_update(params_, learning_rate());
  }

  // A micro-batch whose forward ran: its inputs and what its backward starts from.
  struct MicroBatch {
    std::vector<Tensor> xs;
    Upstream up;
    int64_t step = 1, mb = 1;
  };

  MicroBatch forward(const std::vector<Tensor>& inputs, int64_t step, int64_t mb) {
    if (tp_) tp_->set_phase(Phase::kForward);
    const auto xs = leaf_inputs(mb == 1 ? inputs : model_.make_inputs(config_.seed + mb - 1),
                                config_.input_requires_grad, config_.compute_dtype);
    const auto rng_before = RngState::capture();
    observer_.model_forward_begins();
    quiet_.reset();
    const auto outs = forward_under(autocast_, model_, xs, sites_);
    quiet_.emplace();
    observer_.model_forward_ends();
    record_.forward_draws = record_.forward_draws || RngState::capture() != rng_before;
    // Each micro-batch its own upstream gradient; the first one's is that of a plain step.
    auto up = upstream_of(outs, config_.seed + 7919 * static_cast<uint64_t>(mb - 1), step, part_);
    if (plant_) add_planted_terms(up, *plant_);
    record_outputs(record_, outs, up.loss, step, mb);
    if (step == 1 && mb == 1) record_.output_structure = model_.output_structure();
    return {xs, std::move(up), step, mb};
  }

  // The micro-batch's backward; `partial`: more backwards follow in this step (under a schedule
  // other than sequential, the later ones in the order they run).
  void backward(MicroBatch m) {
    const bool partial = m.mb < micro_batches_;
    backward(std::move(m), partial);
  }

  void backward(MicroBatch m, bool partial) {
    if (tp_) tp_->set_phase(Phase::kBackward);
    ParameterHooks hooks(params_, part_, options_.count_hooks);
    quiet_.reset();
    if (plant_) plant_->set_backward(true);
    if (!m.up.roots.empty()) torch::autograd::backward(m.up.roots, m.up.grads);
    if (plant_) plant_->set_backward(false);
    quiet_.emplace();
    observer_.backward_ended();
    hooks.record(record_, m.step, m.mb, part_);
    keep_input_grads(input_grads_, m.xs, m.step, m.mb);
    if (partial) record_partial_grads(record_, params_, m.step, m.mb);
  }

  Model& model_;
  const RunConfig& config_;
  const StepOptions& options_;
  StepRecord& record_;
  SiteRunner& sites_;
  EvidenceObserver& observer_;
  StepParticipant& part_;
  OpTracer* tp_;
  Plant* plant_;
  const std::optional<AutocastState> autocast_;
  const Schedule schedule_;
  const int64_t micro_batches_;
  std::optional<at::DisableRecordFunctionGuard> quiet_;
  NamedTensors params_;
  std::vector<TensorRecord> input_grads_;
};

}  // namespace

CheckpointOptions CheckpointProtections::options() const {
  return CheckpointOptions()
      .preserve_rng_state(preserve_rng_state)
      .restore_autocast(restore_autocast)
      .check_input_versions(check_input_versions)
      .recompute_fp32(recompute_fp32);
}

StepRecord Runner::run(const Plan* plan, const StepOptions& options, const std::string& label) {
  StepRecord record;
  record.label = label;
  set_phase(label == "reference" ? "the plain step" : label == "checkpointed" ? "the checkpointed step" : "a further step");
  std::optional<OpTracer> tracer;
  if (options.trace != TraceLevel::kNone) {
    tracer.emplace(options.trace, options.value_budget_bytes, options.value_site,
                   options.data_parallel ? engine_op_scopes(config_.data_parallel) : std::vector<std::string>{});
  }
  OpTracer* tp = tracer ? &*tracer : nullptr;
  auto observer = std::make_shared<EvidenceObserver>(record, options.evidence, tp, &model_, plan);
  observer->watch_rewrites = options.watch_rewrites;
  observer->poison = options.watch_rewrites && config_.poison_rewritten;
  auto base = checkpoint_options(config_, options);
  if (plan && (options.evidence || tp)) base.observer(observer);
  Plant* plant = config_.plant.get();
  PlanSiteRunner sites(plan, base, model_, config_.checkpoint.restore_buffers, tp, plant);
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = process_cpu_seconds();
  try {
    StepRun(model_, config_, options, record, sites, *observer).run(start_);
  } catch (const std::exception& e) {
    observer->flush();
    rethrow_stops(e);
    record.error = message_of(e);
  }
  if (plant) {
    plant->set_backward(false);
    record.plant_calls = plant->forward_calls();
  }
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  record.cpu_seconds = process_cpu_seconds() - cpu0;
  if (tp) {
    record.ops = tp->take();
    attach_op_evidence(record);
  }
  for (const auto& [name, p] : model_.named_parameters()) p.mutable_grad() = Tensor();
  return record;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

namespace {

// Gradients live across steps in training: allocated once, zeroed before each step, they belong
// to the baseline.
void zero_gradients(const NamedTensors& params, std::vector<Tensor>& xs, bool allocate) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    if (allocate && p.requires_grad()) p.mutable_grad() = torch::zeros_like(p);
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  for (auto& x : xs) {
    if (x.grad().defined()) x.mutable_grad() = Tensor();
  }
}

// Step 1's upstream gradient of each output (undefined for one that is not floating point).
std::vector<Tensor> upstream_per_output(const std::vector<Tensor>& outs, uint64_t seed) {
  std::vector<Tensor> upstream;
  for (size_t k = 0; k < outs.size(); ++k) {
    upstream.push_back(outs[k].is_floating_point() ? upstream_for(outs[k], seed, 1, k) : Tensor());
  }
  return upstream;
}

// Parameters, their gradients and the inputs: what every step keeps, whatever the policy.
int64_t baseline_bytes(const NamedTensors& params, const std::vector<Tensor>& xs) {
  int64_t bytes = 0;
  auto add = [&bytes](const Tensor& t) { bytes += t.numel() * static_cast<int64_t>(t.element_size()); };
  for (const auto& [name, p] : params) {
    add(p);
    if (p.grad().defined()) add(p.grad());
  }
  for (const auto& x : xs) add(x);
  return bytes;
}

}  // namespace

namespace {

// One measured step: its forward and backward times, CPU time, instructions and peak.
struct TimedStep {
  double forward = 0.0, backward = 0.0, cpu = 0.0;
  std::optional<int64_t> instructions;
  int64_t peak = 0;
};

TimedStep timed_step(Model& model, const RunConfig& config, SiteRunner& sites, const std::vector<Tensor>& xs,
                     const std::optional<AutocastState>& autocast, StepWatch* watch, bool measured) {
  auto& meter = MemoryMeter::of(config.device);
  TimedStep t;
  meter.reset_peak();
  const int64_t before = meter.current_bytes();
  if (watch) watch->step_begins(measured, before);
  const double cpu0 = process_cpu_seconds();
  const auto instructions0 = instruction_counter().read();
  std::vector<Tensor> outs;
  t.forward = time_on_device(config.device, [&] { outs = forward_under(autocast, model, xs, sites); });
  // The same values every step, made afresh in each: a training step's backward makes its
  // outputs' gradient (the loss's backward does), so every measured step holds it once -- a
  // single measured step as much as the last of many.
  const auto upstream = upstream_per_output(outs, config.seed);
  std::vector<Tensor> roots, grads;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (outs[k].requires_grad() && upstream[k].defined()) {
      roots.push_back(outs[k]);
      grads.push_back(upstream[k]);
    }
  }
  t.backward = time_on_device(config.device, [&] {
    if (!roots.empty()) torch::autograd::backward(roots, grads);
  });
  outs.clear();
  roots.clear();
  t.cpu = process_cpu_seconds() - cpu0;
  const auto instructions1 = instruction_counter().read();
  if (instructions0 && instructions1) t.instructions = *instructions1 - *instructions0;
  // A watch that resets the meter's peak keeps the step's peak itself.
  t.peak = watch ? watch->step_ends() : meter.peak_bytes() - before;
  return t;
}

}  // namespace

Measurement Runner::measure(const Plan* plan, int64_t warmup, int64_t steps, bool through_engine) {
  PlanSiteRunner sites(plan, checkpoint_options(config_), model_, config_.checkpoint.restore_buffers, nullptr);
  return measure_with(sites, warmup, steps, nullptr, through_engine);
}

Measurement Runner::measure_with(SiteRunner& sites, int64_t warmup, int64_t steps, StepWatch* watch,
                                 bool through_engine) {
  set_phase("measuring memory and time");
  Measurement m;
  const auto autocast = autocast_for(config_.amp, config_.device);
  try {
    model_.restore(start_);
    seed_all(config_.seed);
    const auto params = model_.named_parameters();
    // A rank measures its shard of the batch, through the engine or alone.
    DataParallel* dp = config_.data_parallel;
    std::optional<ParticipantRun> engine;
    if (through_engine && dp) engine.emplace(*dp);
    auto inputs = model_.make_inputs(config_.seed);
    if (dp) {
      for (auto& x : inputs) x = dp->shard(x);
    }
    auto xs = leaf_inputs(inputs, config_.input_requires_grad);
    zero_gradients(params, xs, /*allocate=*/true);
    m.baseline_bytes = baseline_bytes(params, xs);
    for (int64_t i = 0; i < warmup + steps; ++i) {
      zero_gradients(params, xs, /*allocate=*/false);
      const auto t = timed_step(model_, config_, sites, xs, autocast, watch, i >= warmup);
      if (engine) dp->end_step(params);  // the engine ends its step (after the peak is read)
      if (i < warmup) continue;
      m.cpu_seconds.push_back(t.cpu);
      if (t.instructions) m.instructions.push_back(*t.instructions);
      m.step_seconds.push_back(t.forward + t.backward);
      m.forward_seconds.push_back(t.forward);
      m.peak_bytes = std::max(m.peak_bytes, t.peak);
    }
  } catch (const c10::OutOfMemoryError& e) {
    m.fits = false;
    m.error = "out of memory: " + message_of(e);
    release_cached_memory(config_.device);
  } catch (const std::exception& e) {
    rethrow_stops(e);
    m.error = message_of(e);
  }
  for (const auto& [name, p] : model_.named_parameters()) p.mutable_grad() = Tensor();
  model_.restore(start_);
  return m;
}

namespace {

// The units whose checkpointed calls leave something to explain: a recompute that did not
// reproduce its forward bitwise, failed, or followed a change of the unit's state; a call not
// recomputed; a unit the step did not show. The others need no probe: their recompute was a
// second run of the unit on its forward's inputs, in its forward's state, and gave its outputs.
std::set<std::string> units_to_probe(const Plan& plan, const StepRecord& checkpointed, std::vector<std::string>& reproduced) {
  std::set<std::string> out;
  for (const auto& unit : plan.units) {
    const auto label = Plan::unit_label(unit);
    bool seen = false, explained = true;
    for (const auto& c : checkpointed.calls) {
      if (c.site != label) continue;
      seen = true;
      const bool equal = std::all_of(c.output_diffs.begin(), c.output_diffs.end(), [](const TensorDiff& d) { return d.equal; });
      explained = explained && c.recomputed && !c.recompute_failed && equal && c.state_changed.empty();
    }
    if (seen && explained) {
      reproduced.push_back(label);
    } else {
      out.insert(label);
    }
  }
  return out;
}

// Runs f and adds the process's CPU time it took to `phases` under `name`.
template <class F>
auto timed_phase(std::vector<std::pair<std::string, double>>& phases, const std::string& name, F&& f) {
  const double cpu0 = process_cpu_seconds();
  auto result = f();
  const double spent = process_cpu_seconds() - cpu0;
  auto it = std::find_if(phases.begin(), phases.end(), [&](const auto& p) { return p.first == name; });
  if (it == phases.end()) {
    phases.emplace_back(name, spent);
  } else {
    it->second += spent;
  }
  return result;
}

// Adds the steps of `more` to `m`: the first error and baseline stay, the peak is the higher.
void append_measurement(Measurement& m, Measurement more) {
  if (m.step_seconds.empty() && m.error.empty()) m.baseline_bytes = more.baseline_bytes;
  m.fits = m.fits && more.fits;
  if (m.error.empty()) m.error = std::move(more.error);
  m.peak_bytes = std::max(m.peak_bytes, more.peak_bytes);
  auto add = [](auto& to, const auto& from) { to.insert(to.end(), from.begin(), from.end()); };
  add(m.step_seconds, more.step_seconds);
  add(m.forward_seconds, more.forward_seconds);
  add(m.cpu_seconds, more.cpu_seconds);
  add(m.instructions, more.instructions);
}

}  // namespace

// Where a unit reads state the forward rewrites, the steps again with the next micro-batch's
// forward before the backward, as pipeline schedules and multi-forward losses run them.
void Runner::run_interleaved(const Plan& plan, const StepOptions& plain, RunRecords& r) {
  const auto& calls = r.checkpointed.calls;
  if (std::none_of(calls.begin(), calls.end(), [](const CallEvidence& c) { return !c.state_rewritten.empty(); })) {
    return;
  }
  StepOptions interleaved = plain;
  interleaved.schedule = Schedule::kInterleaved;
  for (const Plan* p : {static_cast<const Plan*>(nullptr), &plan}) {
    interleaved.evidence = p != nullptr;
    const std::string label = p ? "interleaved checkpointed" : "interleaved reference";
    auto record = run(p, interleaved, label);
    r.cpu_seconds.emplace_back(label, record.cpu_seconds);
    (p ? r.interleaved_checkpointed : r.interleaved_reference) = std::move(record);
  }
}

// Plain and checkpointed steps alternate, so a machine that slows down meanwhile slows both.
void Runner::bench_alternating(const Plan& plan, RunRecords& r) {
  r.bench_plain.emplace();
  r.bench_checkpointed.emplace();
  for (int64_t i = 0; i < kBenchSteps; ++i) {
    const int64_t warmup = i == 0 ? kBenchWarmup : 0;
    append_measurement(*r.bench_plain,
                       timed_phase(r.cpu_seconds, "bench, plain", [&] { return measure(nullptr, warmup, 1); }));
    append_measurement(*r.bench_checkpointed,
                       timed_phase(r.cpu_seconds, "bench, checkpointed", [&] { return measure(&plan, warmup, 1); }));
    if (!r.bench_plain->error.empty() || !r.bench_checkpointed->error.empty()) break;
  }
}

namespace {

bool some_recompute_differs(const StepRecord& step) {
  return std::any_of(step.calls.begin(), step.calls.end(), [](const CallEvidence& c) {
    return c.recompute_failed ||
           std::any_of(c.output_diffs.begin(), c.output_diffs.end(), [](const TensorDiff& d) { return !d.equal; });
  });
}

// The dtypes `traced` (the same step again, its ops traced) recorded, given to the calls of `step`
// they belong to: matched by position and site, as both steps ran the same calls in the same order.
void adopt_dtype_trace(StepRecord& step, StepRecord traced) {
  const bool same = std::equal(step.calls.begin(), step.calls.end(), traced.calls.begin(), traced.calls.end(),
                               [](const CallEvidence& a, const CallEvidence& b) { return a.site == b.site; });
  if (!same) return;
  for (size_t i = 0; i < step.calls.size(); ++i) {
    auto& to = step.calls[i];
    auto& from = traced.calls[i];
    to.forward_ops = std::move(from.forward_ops);
    to.recompute_ops = std::move(from.recompute_ops);
    to.forward_dtypes = std::move(from.forward_dtypes);
    to.recompute_dtypes = std::move(from.recompute_dtypes);
    to.forward_autocast = std::move(from.forward_autocast);
    to.recompute_autocast = std::move(from.recompute_autocast);
    to.forward_precision_ops = std::move(from.forward_precision_ops);
    to.recompute_precision_ops = std::move(from.recompute_precision_ops);
  }
}

// A recompute that did not reproduce its forward may have run outside the precision context its
// forward ran under (float8 training, a quantized layer's switch): the checkpointed step again,
// its ops' dtypes traced, tells. Only then: a model whose recomputes reproduce pays nothing.
template <typename RunTimed>
void trace_dtypes_where_differing(const StepOptions& ckpt, StepRecord& checkpointed, RunTimed& run_timed,
                                  const Plan& plan) {
  if (ckpt.trace != TraceLevel::kNone || !some_recompute_differs(checkpointed)) return;
  StepOptions traced = ckpt;
  traced.trace = TraceLevel::kDtypes;
  adopt_dtype_trace(checkpointed, run_timed(&plan, traced, "checkpointed, dtypes traced"));
}

}  // namespace

// The checkpointed step's options: the dtypes traced where the autocast check reads them, the
// state the forward rewrites watched where the schedule check or --poison needs it.
StepOptions Runner::checkpointed_options(const Needs& needs) const {
  StepOptions ckpt;
  ckpt.count_hooks = needs.hooks;
  if (needs.dtype_trace && (config_.amp != Amp::kOff || engine_mixed_precision(config_.data_parallel) != "off")) {
    ckpt.trace = TraceLevel::kDtypes;
  }
  ckpt.watch_rewrites = (needs.interleaved || config_.poison_rewritten) && config_.schedule == Schedule::kSequential &&
                        !config_.data_parallel;
  return ckpt;
}

RunRecords Runner::run_all(const Plan& plan, const Needs& needs) {
  RunRecords r;
  auto run_timed = [&](const Plan* p, const StepOptions& o, const std::string& label) {
    auto record = run(p, o, label);
    r.cpu_seconds.emplace_back(label, record.cpu_seconds);
    return record;
  };
  StepOptions plain;
  plain.evidence = false;
  plain.count_hooks = needs.hooks;
  r.reference = run_timed(nullptr, plain, "reference");
  const StepOptions ckpt = checkpointed_options(needs);
  r.checkpointed = run_timed(&plan, ckpt, "checkpointed");
  if (needs.dtype_trace) trace_dtypes_where_differing(ckpt, r.checkpointed, run_timed, plan);
  if (ckpt.watch_rewrites && needs.interleaved) run_interleaved(plan, plain, r);
  if (needs.amp_study && config_.amp != Amp::kOff) {
    StepOptions fp32 = plain;
    fp32.amp = Amp::kOff;
    r.fp32_reference = run_timed(nullptr, fp32, "fp32 reference");
    StepOptions rec;
    rec.evidence = false;
    rec.checkpoint = config_.checkpoint;
    rec.checkpoint->recompute_fp32 = true;
    r.fp32_recompute = run_timed(&plan, rec, "checkpointed, fp32 recompute");
  }
  if (needs.single_process && config_.data_parallel) {
    StepOptions alone = plain;
    alone.data_parallel = false;
    alone.count_hooks = false;
    r.single_process = run_timed(nullptr, alone, "single process, whole batch");
  }
  // A compiled model runs its units inside the compiled graph, where the probe cannot call one alone.
  r.compiled = model_.compiled_steps();
  if (needs.probe && !r.compiled) {
    // The grad mode the checkpointed forwards ran in (a reentrant checkpoint runs them without).
    bool no_grad = true;
    for (const auto& c : r.checkpointed.calls) no_grad = no_grad && c.forward_no_grad;
    // A step that stopped leaves its calls unfinished: then every unit is probed.
    // Under an op-level policy a recompute hands back the forward's own outputs for the ops it
    // saved: equal outputs do not show that the ops it recomputed reproduced theirs.
    const bool every = config_.probe_every_unit || plan.policy.kind == Policy::Kind::kSac || !r.checkpointed.error.empty();
    std::vector<std::string> reproduced;
    const auto only = units_to_probe(plan, r.checkpointed, reproduced);
    if (!every) r.reproduced_units = reproduced;
    if (every || !only.empty()) {
      r.probes = timed_phase(r.cpu_seconds, "probe", [&] { return probe(plan, no_grad, every ? nullptr : &only); });
    } else {
      r.probes.emplace();
    }
  }
  if (needs.bench) bench_alternating(plan, r);
  if (r.compiled) r.compiled = model_.compiled_steps();  // with what compiling the later steps added
  return r;
}

namespace {

// Calls from the restored state per probed unit: more chances to catch an op whose result
// changes only now and then, at four extra calls per checkpointed unit.
constexpr int kRestarts = 4;


// Runs the forward plainly, but at each checkpointed unit repeats the unit on the inputs it got
// (see UnitProbe) before letting the forward go on.
class ProbeSiteRunner : public UnitSiteRunner {
 public:
  ProbeSiteRunner(const Plan& plan, Model& model, std::vector<UnitProbe>& out, int64_t step,
                  const std::set<std::string>* only)
      : UnitSiteRunner(&plan), model_(model), out_(out), step_(step), only_(only) {}

 protected:
  std::vector<Tensor> run_unit(const std::vector<std::string>& unit, const SiteFn& fn,
                               const std::vector<Tensor>& inputs) override {
    const auto label = Plan::unit_label(unit);
    if (only_ && !only_->count(label)) return fn(inputs);
    return probe_unit(label, fn, inputs);
  }

 private:
  std::vector<Tensor> once(const SiteFn& fn, const std::vector<Tensor>& inputs,
                           std::vector<std::string>* random_ops, bool* private_gen, bool requiring_grad = false) {
    std::vector<Tensor> xs;
    for (const auto& x : inputs) {
      xs.push_back(x.detach().clone());
      if (requiring_grad && xs.back().is_floating_point()) xs.back().requires_grad_(true);
    }
    if (!random_ops) return fn(xs);
    OpTracer tracer(TraceLevel::kNames);
    auto outs = fn(xs);
    std::set<std::string> seen;
    for (const auto& op : tracer.take()) {
      if (op.random && seen.insert(op.name).second) random_ops->push_back(op.name);
      *private_gen = *private_gen || op.private_generator;
    }
    return outs;
  }

  static std::pair<bool, double> same(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    bool eq = a.size() == b.size();
    double worst = 0.0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      auto d = compare_tensors(a[i], b[i], Tolerance());
      eq = eq && d.equal;
      worst = std::max(worst, d.max_abs);
    }
    return {eq, worst};
  }

  // The first call, and what it changed: random numbers drawn, host generators, handed state and
  // the state the checks compare (buffers, attributes, training flags, extra state), by name.
  std::vector<Tensor> first_call(UnitProbe& p, const SiteFn& fn, const std::vector<Tensor>& inputs,
                                 const RngState& r0) {
    std::map<std::string, Tensor> before;
    for (const auto& [name, t] : model_.state_tensors()) before.emplace(name, copy_of(t));
    const auto host_before = model_.host_generators();
    const auto handed_before = model_.handed_state();
    auto a = once(fn, inputs, &p.random_ops, &p.private_generator);
    p.rng_consumed = RngState::capture() != r0;
    p.host_generators = changed_digests(host_before, model_.host_generators());
    p.handed_state = changed_digests(handed_before, model_.handed_state());
    for (const auto& [name, t] : model_.state_tensors()) {
      const auto it = before.find(name);
      // Undefined is state too (an attribute that is None) and equals only itself; state the
      // call added is changed state.
      if (it == before.end() || !compare_tensors(it->second, t, Tolerance()).equal) p.changed_state.push_back(name);
    }
    return a;
  }

  // A second call that throws from the state the first left (a cache it appends to, of another
  // length now) differs from it; the restarts say whether the state is the cause.
  std::vector<Tensor> repeat_call(UnitProbe& p, const SiteFn& fn, const std::vector<Tensor>& inputs) {
    try {
      return once(fn, inputs, nullptr, nullptr);
    } catch (const std::exception& e) {
      rethrow_stops(e);
      p.repeat_error = message_of(e);
    }
    return {};
  }

  // Calls from the restored state: any difference means the unit is non-deterministic. A
  // non-deterministic op can agree by chance, so several restarts are tried.
  void restarts(UnitProbe& p, const SiteFn& fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& a,
                const ModelState& s0, const RngState& r0) {
    for (int k = 0; k < kRestarts && p.restart_equal; ++k) {
      model_.restore(s0);
      r0.restore();
      auto c = once(fn, inputs, nullptr, nullptr);
      auto [restart_eq, d2] = same(a, c);
      if (!restart_eq) {
        p.restart_equal = false;
        p.max_abs_diff = d2;
        p.first_outputs = a;
        p.other_outputs = c;
      }
    }
  }

  // The recompute of a checkpoint whose forward runs without autograd runs with it, its inputs
  // requiring grad: a kernel chosen by whether gradients are needed (attention with a mask that
  // requires grad) computes other values there.
  void grad_mode_call(UnitProbe& p, const SiteFn& fn, const std::vector<Tensor>& inputs,
                      const std::vector<Tensor>& a, const ModelState& s0, const RngState& r0) {
    model_.restore(s0);
    r0.restore();
    std::vector<Tensor> g;
    try {
      torch::AutoGradMode grad(true);
      g = once(fn, inputs, nullptr, nullptr, /*requiring_grad=*/true);
    } catch (const std::exception& e) {
      rethrow_stops(e);
      g.clear();  // a unit that cannot run so (an in-place op on its input) shows nothing here
    }
    if (g.empty()) return;
    for (auto& t : g) t = t.detach();
    std::tie(p.grad_mode_equal, p.grad_mode_diff) = same(a, g);
  }

  void probe_calls(UnitProbe& p, const SiteFn& fn, const std::vector<Tensor>& inputs, const ModelState& s0,
                   const RngState& r0) {
    auto a = first_call(p, fn, inputs, r0);
    r0.restore();
    auto b = repeat_call(p, fn, inputs);
    auto [repeat_eq, d1] = p.repeat_error.empty() ? same(a, b) : std::pair<bool, double>{false, 0.0};
    p.repeat_equal = repeat_eq;
    p.max_abs_diff = d1;
    // Only when all restarts agree with the first call is a differing repeat put down to state
    // the call changed.
    restarts(p, fn, inputs, a, s0, r0);
    if (p.restart_equal && !torch::GradMode::is_enabled()) grad_mode_call(p, fn, inputs, a, s0, r0);
    if (!repeat_eq && p.restart_equal && p.repeat_error.empty()) {
      p.first_outputs = a;
      p.other_outputs = b;
    }
    if (repeat_eq && !p.restart_equal) p.repeat_equal = false;
  }

  std::vector<Tensor> probe_unit(const std::string& label, const SiteFn& fn,
                                 const std::vector<Tensor>& inputs) {
    UnitProbe p;
    p.site = label;
    p.step = step_;
    const ModelState s0 = model_.snapshot();
    const RngState r0 = RngState::capture();
    try {
      probe_calls(p, fn, inputs, s0, r0);
    } catch (const std::exception& e) {
      rethrow_stops(e);
      p.error = message_of(e);
    }
    out_.push_back(p);
    // Go on from the state the forward would have left: the first call's.
    model_.restore(s0);
    r0.restore();
    return once(fn, inputs, nullptr, nullptr);
  }

  Model& model_;
  std::vector<UnitProbe>& out_;
  int64_t step_;
  const std::set<std::string>* only_;
};

}  // namespace

std::vector<UnitProbe> Runner::probe(const Plan& plan, bool no_grad, const std::set<std::string>* only) {
  set_phase("the determinism probe");
  std::vector<UnitProbe> out;
  const auto autocast = autocast_for(config_.amp, config_.device);
  try {
    model_.restore(start_);
    seed_all(config_.seed);
    const auto inputs = model_.make_inputs(config_.seed);
    torch::AutoGradMode grad_mode(!no_grad);  // as the checkpoint under test runs its forward
    ProbeSiteRunner sites(plan, model_, out, 1, only);
    forward_under(autocast, model_, inputs, sites);
  } catch (const std::exception& e) {
    rethrow_stops(e);
    UnitProbe p;
    p.site = "(forward)";
    p.error = message_of(e);
    out.push_back(p);
  }
  model_.restore(start_);
  return out;
}

}  // namespace ckcheck

