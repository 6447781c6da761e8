#include "harness/support/enum_names.h"
#include "harness/runner/trace.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <iterator>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_set>

#include "harness/runner/compare.h"
#if defined(USE_C10D_GLOO) && !defined(CKCHECK_NO_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include "harness/support/compat.h"
#include "harness/support/global_state.h"

namespace ckcheck {

const char* phase_name(Phase phase) {
  static constexpr EnumName<Phase> kNames[] = {
      {Phase::kForward, "forward"}, {Phase::kRecompute, "recompute"}, {Phase::kBackward, "backward"}};
  return name_in(kNames, phase);
}

bool is_random_op(const std::string& name) {
  static const std::set<std::string> random_ops = {
      "aten::bernoulli",    "aten::bernoulli_",    "aten::uniform_",     "aten::normal",
      "aten::normal_",      "aten::rand",          "aten::rand_like",    "aten::randn",
      "aten::randn_like",   "aten::randint",       "aten::randint_like", "aten::randperm",
      "aten::multinomial",  "aten::exponential_",  "aten::geometric_",   "aten::log_normal_",
      "aten::cauchy_",      "aten::random_",       "aten::native_dropout", "aten::rrelu_with_noise",
      "aten::poisson"};
  // Not aten::dropout and its kin: they draw through bernoulli_ when they draw at all (p > 0 in
  // training), and calling them with p = 0 consumes nothing.
  return random_ops.count(name) > 0;
}

bool is_cast_op(const std::string& name) {
  static const std::set<std::string> casts = {"aten::to", "aten::_to_copy", "aten::type_as",
                                              "aten::_autocast_to_reduced_precision",
                                              "aten::_autocast_to_full_precision"};
  return casts.count(name) > 0;
}

bool is_collective_op(const std::string& name) { return name.rfind("c10d::", 0) == 0; }

bool is_reduced_precision(const std::string& dtype) {
  auto starts = [&](const char* prefix) { return dtype.rfind(prefix, 0) == 0; };
  return dtype == "Half" || dtype == "BFloat16" || starts("Float8") || starts("Float4") || starts("QInt") ||
         starts("QUInt");
}

struct OpTracer::Impl {
  TraceLevel level;
  int64_t budget;
  std::string value_site;
  std::mutex mutex;
  std::vector<OpRecord> records;
  struct Frame {
    std::string site;
    int64_t call;
  };
  std::vector<Frame> sites;
  Phase phase = Phase::kForward;
  std::map<int64_t, std::string> site_of_seq;  // forward/recompute op seq_nr -> site
  std::vector<std::string> nodes;              // backward nodes being run
  int depth = 0;
  std::vector<std::string> skipped_scopes;
  int skipping = 0;  // skipped scopes open
  std::map<std::string, bool> composite;  // operator (with overload) -> CompositeImplicitAutograd
  at::CallbackHandle handle = 0;
};

namespace {

std::atomic<OpTracer::Impl*> active{nullptr};

struct Ctx : at::ObserverContext {
  size_t record = 0;
  bool node = false;
  bool skipped_scope = false;
  std::chrono::steady_clock::time_point start;
};

// Whether the op is decomposed above autograd (CompositeImplicitAutograd, as aten::linear): the
// ops it calls are the ones autograd and an op-level checkpoint policy see.
bool is_composite(OpTracer::Impl& t, const at::RecordFunction& fn) {
  const auto op = fn.operator_name();
  if (!op) return false;
  const std::string key = op->name + "." + op->overload_name;
  const auto it = t.composite.find(key);
  if (it != t.composite.end()) return it->second;
  const auto handle = c10::Dispatcher::singleton().findOp(*op);
  const bool composite = handle && handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  t.composite.emplace(key, composite);
  return composite;
}

bool inside(const std::string& site, const std::string& outer) {
  return outer.empty() || site == outer ||
         (site.size() > outer.size() && site.compare(0, outer.size(), outer) == 0 &&
          site[outer.size()] == '.');
}

// "cpu:BFloat16,cuda:Half", or "off": the autocast state an op runs under.
std::string autocast_tag() {
  const auto a = AutocastState::capture();
  std::string tag;
  if (a.cpu_enabled) tag += std::string("cpu:") + c10::toString(a.cpu_dtype);
  if (a.cuda_enabled) tag += std::string(tag.empty() ? "" : ",") + "cuda:" + c10::toString(a.cuda_dtype);
  return tag.empty() ? "off" : tag;
}

// Whether the op draws random numbers, and from a generator other than the default one.
void note_random_draws(const at::RecordFunction& fn, OpRecord& r) {
  r.random = is_random_op(r.name);
  for (const auto& in : fn.inputs()) {
    if (in.isGenerator()) {
      const auto& gen = in.toGenerator();
      if (!gen.defined()) continue;
      r.random = true;
      const auto& def = at::globalContext().defaultGenerator(gen.device());
      r.private_generator = r.private_generator || gen.unsafeGetGeneratorImpl() != def.unsafeGetGeneratorImpl();
    }
  }
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  OpTracer::Impl* t = active.load();
  if (!t) return nullptr;
  std::lock_guard<std::mutex> lock(t->mutex);
  auto ctx = std::make_unique<Ctx>();
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    const std::string scope = fn.name();
    for (const auto& prefix : t->skipped_scopes) {
      if (scope.rfind(prefix, 0) == 0) {
        ctx->skipped_scope = true;
        ++t->skipping;
        return ctx;
      }
    }
    return nullptr;
  }
  if (t->skipping > 0 && fn.scope() == at::RecordScope::FUNCTION) return nullptr;
  static const std::string engine_prefix = "autograd::engine::evaluate_function: ";
  std::string name = fn.name();
  const bool engine = name.rfind(engine_prefix, 0) == 0;
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION || engine) {
    // An autograd node: not an op itself, the context of the ops it runs.
    ctx->node = true;
    if (engine) name = name.substr(engine_prefix.size());
    const auto it = t->site_of_seq.find(fn.seqNr());
    std::string site = it == t->site_of_seq.end() ? "" : it->second;
    if (site.empty() && !t->nodes.empty()) site = t->nodes.back().substr(t->nodes.back().find('|') + 1);
    t->nodes.push_back(name + "|" + site);
    return ctx;
  }
  OpRecord r;
  r.index = static_cast<int64_t>(t->records.size());
  r.name = name;
  r.depth = t->depth++;
  r.phase = t->phase;
  r.seq_nr = fn.seqNr();
  if (!t->sites.empty()) {
    r.site = t->sites.back().site;
    for (auto it = t->sites.rbegin(); it != t->sites.rend(); ++it) {
      if (it->call >= 0) {
        r.call = it->call;
        break;
      }
    }
  }
  if (t->phase == Phase::kBackward && !t->nodes.empty()) {
    const auto& top = t->nodes.back();
    const auto bar = top.find('|');
    r.node = top.substr(0, bar);
    r.site = top.substr(bar + 1);
  }
  if (t->phase != Phase::kBackward && r.seq_nr >= 0 && !r.site.empty()) {
    t->site_of_seq.emplace(r.seq_nr, r.site);
  }
  if (t->level >= TraceLevel::kDtypes) {
    r.autocast = autocast_tag();
    r.composite = is_composite(*t, fn);
  }
  note_random_draws(fn, r);
  ctx->record = t->records.size();
  t->records.push_back(std::move(r));
  ctx->start = std::chrono::steady_clock::now();
  return ctx;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* base) {
  const auto end = std::chrono::steady_clock::now();
  OpTracer::Impl* t = active.load();
  auto* ctx = static_cast<Ctx*>(base);
  if (!t || !ctx) return;
  // Our own tensor work below must not be recorded.
  at::DisableRecordFunctionGuard no_recording;
  std::lock_guard<std::mutex> lock(t->mutex);
  if (ctx->skipped_scope) {
    --t->skipping;
    return;
  }
  if (ctx->node) {
    if (!t->nodes.empty()) t->nodes.pop_back();
    return;
  }
  --t->depth;
  if (ctx->record >= t->records.size()) return;
  auto& r = t->records[ctx->record];
  r.seconds = std::chrono::duration<double>(end - ctx->start).count();
  if (t->level < TraceLevel::kDtypes) return;
  for (const auto& out : fn.outputs()) {
    std::vector<torch::Tensor> tensors;
    if (out.isTensor()) {
      tensors.push_back(out.toTensor());
    } else if (out.isTensorList()) {
      for (const auto& x : out.toTensorVector()) tensors.push_back(x);
    }
    for (const auto& x : tensors) {
      if (!x.defined()) continue;
      r.shapes.emplace_back(x.sizes().begin(), x.sizes().end());
      r.dtypes.emplace_back(c10::toString(x.scalar_type()));
      if (!x.is_view()) r.output_bytes += x.numel() * static_cast<int64_t>(x.element_size());
      if (t->level < TraceLevel::kFull) continue;
      r.fingerprints.push_back(fingerprint(x));
      if (x.is_floating_point() && x.numel() > 0) {
        const auto d = x.detach();
        if (!torch::isfinite(d).all().item<bool>()) {
          r.nonfinite = true;
          r.nan = r.nan || torch::isnan(d).any().item<bool>();
        }
      }
      const int64_t bytes = x.numel() * static_cast<int64_t>(x.element_size());
      if (bytes <= t->budget && inside(r.site, t->value_site) && r.phase != Phase::kBackward) {
        t->budget -= bytes;
        r.values.push_back(x.detach().to(torch::kCPU).clone());
      }
    }
  }
}

}  // namespace

OpTracer::OpTracer(TraceLevel level, int64_t value_budget_bytes, std::string value_site,
                   std::vector<std::string> skipped_scopes)
    : level_(level), impl_(std::make_unique<Impl>()) {
  impl_->level = level;
  impl_->skipped_scopes = std::move(skipped_scopes);
  impl_->budget = value_budget_bytes;
  impl_->value_site = std::move(value_site);
  if (level == TraceLevel::kNone) return;
  Impl* expected = nullptr;
  TORCH_CHECK(active.compare_exchange_strong(expected, impl_.get()),
              "ckcheck: only one op tracer can record at a time");
  std::unordered_set<at::RecordScope, std::hash<at::RecordScope>> scopes = {at::RecordScope::FUNCTION,
                                                                            at::RecordScope::BACKWARD_FUNCTION};
  if (!impl_->skipped_scopes.empty()) scopes.insert(at::RecordScope::USER_SCOPE);
  impl_->handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                            .needsInputs(true)
                                            .needsOutputs(level >= TraceLevel::kDtypes)
                                            .scopes(scopes));
}

OpTracer::~OpTracer() {
  if (level_ == TraceLevel::kNone) return;
  at::removeCallback(impl_->handle);
  active.store(nullptr);
}

void OpTracer::push_site(const std::string& site, int64_t call) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->sites.push_back({site, call});
}

void OpTracer::pop_site() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->sites.empty()) impl_->sites.pop_back();
}

void OpTracer::set_phase(Phase phase) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->phase = phase;
}

Phase OpTracer::phase() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->phase;
}

std::vector<OpRecord> OpTracer::take() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<OpRecord> out;
  out.swap(impl_->records);
  return out;
}

namespace {

// Where the innermost DrawWatch of this thread records.
thread_local std::vector<DrawTargets> draw_targets;

// The device a random op draws on: its first tensor argument's, or the CPU.
c10::Device draw_device(const at::RecordFunction& fn) {
  for (const auto& in : fn.inputs()) {
    if (in.isTensor() && in.toTensor().defined()) return in.toTensor().device();
  }
  return c10::Device(c10::kCPU);
}

// " on default_pg (2 ranks)": the process group a c10d op is given, where this build has c10d.
std::string group_words(const c10::IValue& v) {
#if defined(USE_C10D_GLOO) && !defined(CKCHECK_NO_GLOO)
  if (!v.isCustomClass() || v.type()->str().find("ProcessGroup") == std::string::npos) return "";
  const auto group = v.toCustomClass<c10d::ProcessGroup>();
  const auto& desc = group->getGroupDesc();
  const bool described = !desc.empty() && desc != "undefined";
  const int size = group->getSize();
  return fmt::format(" on {} ({} rank{})", described ? desc : "group " + group->getGroupName(), size, size == 1 ? "" : "s");
#else
  (void)v;
  return "";
#endif
}

// "c10d::allreduce_ 8x16 Float on default_pg (2 ranks)": the op, the tensors it sends or
// receives, and its group.
std::string collective_entry(const std::string& name, const at::RecordFunction& fn) {
  std::string group;
  std::vector<std::string> tensors;
  auto add = [&](const at::Tensor& t) {
    if (t.defined()) tensors.push_back(fmt::format("{} {}", fmt::join(t.sizes(), "x"), c10::toString(t.scalar_type())));
  };
  for (const auto& in : fn.inputs()) {
    if (in.isTensor()) add(in.toTensor());
    if (in.isTensorList()) {
      for (const auto& t : in.toTensorVector()) add(t);
    }
    if (group.empty()) group = group_words(in);
  }
  return (tensors.empty() ? name : fmt::format("{} {}", name, fmt::join(tensors, ", "))) + group;
}

std::unique_ptr<at::ObserverContext> on_draw(const at::RecordFunction& fn) {
  if (draw_targets.empty()) return nullptr;
  const std::string name = fn.name();
  if (draw_targets.back().collectives && is_collective_op(name)) {
    draw_targets.back().collectives->push_back(collective_entry(name, fn));
    return nullptr;
  }
  if (!draw_targets.back().draws) return nullptr;
  std::optional<at::Generator> given;
  for (const auto& in : fn.inputs()) {
    if (in.isGenerator() && in.toGenerator().defined()) given = in.toGenerator();
  }
  if (!given && !is_random_op(name)) return nullptr;
  const auto device = draw_device(fn);
  const auto& fallback = at::globalContext().defaultGenerator(given ? given->device() : device);
  const at::Generator gen = given ? *given : fallback;
  RandomDraw d;
  d.op = name;
  d.private_generator = given && gen.unsafeGetGeneratorImpl() != fallback.unsafeGetGeneratorImpl();
  {
    at::DisableRecordFunctionGuard quiet;  // reading the state is not the step's work
    d.state = fingerprint(compat::generator_state(gen));
  }
  draw_targets.back().draws->push_back(std::move(d));
  return nullptr;
}

}  // namespace

// One callback per thread, while some watch lives.
thread_local at::CallbackHandle draw_callback = 0;

DrawWatch::DrawWatch(std::vector<RandomDraw>& draws, std::vector<std::string>* collectives) : target_(&draws) {
  draw_targets.push_back({&draws, collectives});
  if (draw_targets.size() == 1) {
    draw_callback = at::addThreadLocalCallback(
        at::RecordFunctionCallback(on_draw).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  }
}

DrawWatch::~DrawWatch() {
  // Its own target, wherever it stands (a watch may end before one begun after it).
  const auto it = std::find_if(draw_targets.rbegin(), draw_targets.rend(),
                               [&](const DrawTargets& t) { return t.draws == target_; });
  if (it != draw_targets.rend()) draw_targets.erase(std::next(it).base());
  if (draw_targets.empty() && draw_callback != 0) {
    at::removeCallback(draw_callback);
    draw_callback = 0;
  }
}

}  // namespace ckcheck
