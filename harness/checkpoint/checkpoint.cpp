#include "ckcheck/checkpoint.h"

#include <ATen/SequenceNumber.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/util/DimVector.h>
#include <c10/util/SmallVector.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "harness/support/global_state.h"

namespace ckcheck {
namespace {

using torch::Tensor;
using torch::autograd::variable_list;

thread_local int recompute_depth = 0;
std::atomic<int64_t> next_call_id{0};

struct RecomputeMark {
  RecomputeMark() { ++recompute_depth; }
  ~RecomputeMark() { --recompute_depth; }
};

// Keeps the checkpoint's own ops (a detach, a clone) out of op traces: the profiler's, an
// observer's. Turning RecordFunction off and on rebuilds the thread's callback list, which costs
// more than the rest of a small call, so it is done only where some callback would see the ops.
class Quiet {
 public:
  Quiet() : turned_off_(at::isRecordFunctionEnabled() && at::hasCallbacks()) {
    if (turned_off_) at::enableRecordFunction(false);
  }
  ~Quiet() {
    if (turned_off_) at::enableRecordFunction(true);
  }
  Quiet(const Quiet&) = delete;
  Quiet& operator=(const Quiet&) = delete;

 private:
  bool turned_off_;
};

// Tensors' version counters, one per tensor (-1 for an undefined one); a call's few on the stack.
using Versions = c10::SmallVector<int64_t, 8>;

// Everything the backward needs, held by the call's autograd node. The inputs are held here rather
// than as saved variables so that a changed input is reported with the checkpoint's own error
// (site and input index) instead of the saved-variable one.
struct CheckpointState {
  TensorsFn fn;
  CheckpointOptions options;
  CheckpointCall call;
  // The caller's inputs, then the captured tensors: what the function read from outside without
  // being given it (parameters, tensors of the caller's graph) and that requires grad. All of them
  // are inputs of the autograd node, so the engine routes their gradients as plain autograd would.
  std::vector<Tensor> inputs;
  size_t num_inputs = 0;  // the caller's, at the front of `inputs`
  Versions versions;
  // Each forward output's shape and dtype: the recompute must reproduce them.
  c10::SmallVector<std::pair<c10::DimVector, c10::ScalarType>, 2> output_meta;
  std::optional<RngFork> rng;
  AutocastState autocast;
  bool consumed = false;
};

// Tensors already seen, by identity: a short list searched in order (a segment reads a few
// parameters), a hash set once it grows past that.
class SeenTensors {
 public:
  // False when `t` was seen before.
  bool insert(const c10::TensorImpl* t) {
    if (set_.empty()) {
      if (std::find(list_.begin(), list_.end(), t) != list_.end()) return false;
      if (list_.size() < kListMax) {
        list_.push_back(t);
        return true;
      }
      set_.insert(list_.begin(), list_.end());
    }
    return set_.insert(t).second;
  }

 private:
  static constexpr size_t kListMax = 32;
  c10::SmallVector<const c10::TensorImpl*, kListMax> list_;
  std::unordered_set<const c10::TensorImpl*> set_;
};

// Finds the captured tensors: while the function runs under no-grad in the forward, an op input
// that requires grad came from outside it (nothing made under no-grad requires grad), so the op
// inputs that require grad and are not the caller's inputs are exactly the leaves and graph tensors
// plain autograd would have reached through the function. A thread-local RecordFunction callback
// sees them. A function may turn grad mode back on for a part of itself (a checkpoint inside it,
// forces computed as a gradient of an energy): what it makes there requires grad too, and is told
// from the caller's tensors by its grad_fn, made on this thread since the call began. Collectors
// nest (a checkpoint inside the function): the outermost registers the one callback, and an op
// counts for every collector open on the thread.
class CapturedTensors {
 public:
  explicit CapturedTensors(const std::vector<Tensor>& inputs)
      : previous_(current_), thread_(at::RecordFunction::currentThreadId()), start_(at::sequence_number::peek()) {
    if (turned_on_) at::enableRecordFunction(true);
    for (const auto& x : inputs) seen_.insert(x.unsafeGetTensorImpl());
    if (previous_ == nullptr) {
      static const auto callback =
          at::RecordFunctionCallback(&CapturedTensors::on_op).needsInputs(true).scopes({at::RecordScope::FUNCTION});
      handle_ = at::addThreadLocalCallback(callback);
    }
    current_ = this;
  }
  ~CapturedTensors() {
    current_ = previous_;
    if (previous_ == nullptr) at::removeCallback(handle_);
    if (turned_on_) at::enableRecordFunction(false);
  }
  CapturedTensors(const CapturedTensors&) = delete;
  CapturedTensors& operator=(const CapturedTensors&) = delete;

  std::vector<Tensor> take() { return std::move(found_); }

  // Whether `t` was computed by the function itself, under grad mode, since this call began. Read
  // from the autograd metadata as it stands (a leaf has no grad_fn): Tensor::grad_fn() costs a
  // virtual call for every parameter.
  bool made_inside(const Tensor& t) const {
    const auto* meta = torch::autograd::impl::get_autograd_meta(t);
    const auto* fn = meta != nullptr ? meta->grad_fn_.get() : nullptr;
    return fn != nullptr && fn->thread_id() == thread_ && fn->sequence_nr() >= start_;
  }

 private:
  static std::unique_ptr<at::ObserverContext> on_op(const at::RecordFunction& fn) {
    auto* innermost = current_;  // read once: a thread-local costs a call each time
    for (const auto& v : fn.inputs()) innermost->visit(v);
    return nullptr;
  }
  // One op input: a tensor, or a list or tuple that may hold some (a tensor list is a list of
  // tensors). Most inputs are tensors that do not require grad, and are left at the first test.
  void visit(const c10::IValue& v) {
    if (v.isTensor()) {
      const auto& t = v.toTensor();
      if (!t.defined() || !t.requires_grad()) return;
      for (auto* c = this; c != nullptr; c = c->previous_) c->add(t);
    } else if (v.isList()) {
      for (const auto& e : v.toListRef()) visit(e);
    } else if (v.isTuple()) {
      for (const auto& e : v.toTupleRef().elements()) visit(e);
    }
  }
  void add(const Tensor& t) {
    if (!seen_.insert(t.unsafeGetTensorImpl()) || made_inside(t)) return;
    if (found_.empty()) found_.reserve(16);  // a block's parameters, in one allocation
    found_.push_back(t);
  }

  static thread_local CapturedTensors* current_;
  // On even where the caller turned RecordFunction off: without it the parameters would go unseen
  // and get no gradient. (Turned on only where it is off: each turn rebuilds the callback list.)
  bool turned_on_ = !at::isRecordFunctionEnabled();
  CapturedTensors* previous_;
  uint64_t thread_;
  uint64_t start_;  // the sequence number the first node made in the call gets
  at::CallbackHandle handle_{};
  SeenTensors seen_;
  std::vector<Tensor> found_;
};

thread_local CapturedTensors* CapturedTensors::current_ = nullptr;

std::string where(const CheckpointCall& call) {
  return call.site.empty() ? std::string("ckcheck::checkpoint")
                           : fmt::format("ckcheck::checkpoint({})", call.site);
}

Versions versions_of(const std::vector<Tensor>& tensors) {
  Versions v;
  for (const auto& t : tensors) v.push_back(t.defined() ? static_cast<int64_t>(t._version()) : -1);
  return v;
}

bool shares_impl(const Tensor& t, const std::vector<Tensor>& others) {
  for (const auto& o : others) {
    if (o.defined() && o.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return true;
  }
  return false;
}

// The node a tensor's gradient enters the graph at: its grad_fn, or a leaf's accumulator (null
// for a leaf no graph has reached yet).
torch::autograd::Node* gradient_node(const Tensor& t) {
  if (const auto& fn = t.grad_fn()) return fn.get();
  return torch::autograd::impl::try_get_grad_accumulator(t).get();
}

// The nodes upstream of `from` in the caller's graph, not going past a target node: which targets
// are reached, and whether any path ends elsewhere (at a leaf or node that is not a target).
struct Upstream {
  bool reaches_target = false;
  bool ends_elsewhere = false;
};

Upstream upstream_of(const torch::autograd::Node& from, const std::unordered_set<const torch::autograd::Node*>& targets) {
  Upstream u;
  std::vector<const torch::autograd::Node*> todo;
  std::unordered_set<const torch::autograd::Node*> seen;
  for (const auto& e : from.next_edges()) todo.push_back(e.function.get());
  while (!todo.empty()) {
    const auto* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (targets.count(node) != 0) {
      u.reaches_target = true;
      continue;
    }
    bool any = false;
    for (const auto& e : node->next_edges()) {
      if (e.function) {
        todo.push_back(e.function.get());
        any = true;
      }
    }
    u.ends_elsewhere = u.ends_elsewhere || !any;
  }
  return u;
}

std::unordered_set<const torch::autograd::Node*> gradient_nodes(const std::vector<Tensor>& tensors) {
  std::unordered_set<const torch::autograd::Node*> nodes;
  for (const auto& t : tensors) {
    if (auto* node = gradient_node(t)) nodes.insert(node);
  }
  return nodes;
}

// Captured tensors of the caller's graph computed from other captured tensors -- autocast's cached
// low-precision copy of a parameter, a bias computed from a parameter the function also reads.
// Differentiating up to both would run the caller's graph between them inside this backward and
// again in the engine. When everything such a tensor comes from is captured too, it is no input of
// the node: its gradient reaches them through the caller's graph inside the backward. When it also
// comes from elsewhere, that part would be lost: refused, in one line.
std::vector<Tensor> settle_dependent_captures(const CheckpointCall& call, std::vector<Tensor> captured) {
  if (std::none_of(captured.begin(), captured.end(), [](const Tensor& t) { return t.grad_fn() != nullptr; })) {
    return captured;  // leaves only (parameters): none is computed from another
  }
  const auto targets = gradient_nodes(captured);
  std::vector<Tensor> kept;
  for (auto& t : captured) {
    if (t.grad_fn()) {
      const auto u = upstream_of(*t.grad_fn(), targets);
      TORCH_CHECK(!(u.reaches_target && u.ends_elsewhere), where(call), ": the function reads a tensor of the caller's "
                  "graph (", t.scalar_type(), t.sizes(), ", not passed to the checkpoint) computed both from a "
                  "tensor it also reads (a parameter) and from others; pass that tensor to the checkpoint as an input");
      if (u.reaches_target) continue;
    }
    kept.push_back(std::move(t));
  }
  return kept;
}

// Under create_graph the backward differentiates up to the inputs themselves; an input computed
// from another tensor it differentiates up to (the output of the same module checkpointed before)
// would have the caller's graph between them run inside this backward and again by the engine.
void refuse_dependent_inputs(const CheckpointState& s, c10::ArrayRef<size_t> slots) {
  std::vector<Tensor> asked;
  for (const auto i : slots) asked.push_back(s.inputs[i]);
  const auto targets = gradient_nodes(asked);
  for (const auto i : slots) {
    if (i >= s.num_inputs || !s.inputs[i].grad_fn()) continue;
    TORCH_CHECK(!upstream_of(*s.inputs[i].grad_fn(), targets).reaches_target, where(s.call),
                ": double backward (create_graph=true) through a checkpoint whose input ", i,
                " is computed from a tensor the function also reads (the same parameters checkpointed twice); "
                "compute higher-order gradients without checkpointing this segment");
  }
}

// While the recompute is differentiated up to the captured tensors, their gradient hooks (and
// retain_grad) are set aside: the engine runs them once, when it takes the gradients this node
// returns, as it would without the checkpoint.
class HooksSetAside {
 public:
  explicit HooksSetAside(const std::vector<Tensor>& tensors) {
    std::unordered_set<const torch::autograd::Node*> done;
    for (const auto& t : tensors) {
      if (const auto& fn = t.grad_fn()) {
        if (!done.insert(fn.get()).second) continue;
        Entry e{t, fn, {}, {}};
        e.pre.swap(fn->tensor_pre_hooks());
        e.retains.swap(fn->retains_grad_hooks());
        entries_.push_back(std::move(e));
      } else {
        Entry e{t, nullptr, {}, {}};
        e.pre.swap(torch::autograd::impl::hooks(t));
        entries_.push_back(std::move(e));
      }
    }
  }
  ~HooksSetAside() {
    for (auto& e : entries_) {
      if (e.node) {
        e.node->tensor_pre_hooks().swap(e.pre);
        e.node->retains_grad_hooks().swap(e.retains);
      } else {
        torch::autograd::impl::hooks(e.tensor).swap(e.pre);
      }
    }
  }
  HooksSetAside(const HooksSetAside&) = delete;
  HooksSetAside& operator=(const HooksSetAside&) = delete;

 private:
  struct Entry {
    Tensor tensor;
    c10::intrusive_ptr<torch::autograd::Node> node;
    std::vector<std::unique_ptr<torch::autograd::FunctionPreHook>> pre;
    std::unordered_map<size_t, std::unique_ptr<torch::autograd::FunctionPreHook>> retains;
  };
  std::vector<Entry> entries_;
};

// A backward that reaches the checkpoint again: allowed while the graph is kept (retain_graph), as
// plain autograd allows it; refused once the first backward has released the inputs.
void refuse_released(const CheckpointState& s) {
  TORCH_CHECK(!s.consumed, where(s.call),
              ": backward ran a second time through the same checkpoint, after a backward that did not keep "
              "the graph; pass retain_graph=true to the first backward, or run the forward again for each backward");
}

void check_inputs_unchanged(const CheckpointState& s) {
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const auto now = static_cast<int64_t>(s.inputs[i]._version());
    if (now == s.versions[i]) continue;
    const auto what = i < s.num_inputs ? fmt::format("input {}", i)
                                       : c10::str("a tensor it reads from outside (a parameter or captured tensor, ",
                                                  s.inputs[i].scalar_type(), s.inputs[i].sizes(), ")");
    TORCH_CHECK(false, where(s.call), ": ", what, " was changed in place after the forward (version ", s.versions[i],
                " -> ", now, "), so the recompute would start from other data; clone the tensor before "
                "changing it, or do not checkpoint this segment");
  }
}

// A leaf that requires grad and shares `x`'s data and version counter: what x.detach() then
// requires_grad_() give, made directly rather than through two dispatched ops (a tenth of a small
// call's machinery); a tensor subclass detaches as its own TensorImpl says.
Tensor leaf_of(const Tensor& x) {
  auto* impl = x.unsafeGetTensorImpl();
  auto copy = impl->shallow_copy_and_detach(impl->version_counter(), /*allow_tensor_metadata_change=*/false);
  copy->set_autograd_meta(nullptr);
  Tensor leaf(std::move(copy));
  leaf.set_requires_grad(true);
  return leaf;
}

// The function again, from the caller's inputs themselves (the recomputed graph reaches the same
// leaves and graph tensors as the forward would have), under the forward's RNG and autocast state.
//
// Inputs that require grad go in as leaves of their own (detached): the backward differentiates up
// to them and stops there, never running the caller's graph behind an input, which may also lead
// to the parameters (the same module checkpointed twice) and is the engine's to run. Under
// create_graph the inputs go in themselves, so that the gradients carry a graph back to them.
std::vector<Tensor> recompute(const CheckpointState& s, bool create_graph, std::vector<Tensor>& inputs) {
  // Fork the RNG: replay the forward's state for the recompute, then give the caller back the
  // state it had, so that checkpointing leaves the random stream of the step unchanged.
  std::optional<RngFork> caller_rng;
  if (s.rng) {
    caller_rng = RngFork::capture();
    s.rng->restore_over(*caller_rng);
  }
  std::optional<AutocastScope> autocast;
  if (s.options.recompute_fp32()) {
    auto off = s.autocast;
    off.cpu_enabled = off.cuda_enabled = false;
    autocast.emplace(off);
  } else if (s.options.restore_autocast() && (s.autocast.any_enabled() || !(s.autocast == AutocastState::capture()))) {
    // Left out where autocast is off now and was off in the forward: the scope would set what is
    // already set, and no cast is cached for it to clear.
    autocast.emplace(s.autocast);
  }
  std::vector<Tensor> outputs;
  {
    RecomputeMark mark;
    torch::AutoGradMode grad(true);
    inputs.assign(s.inputs.begin(), s.inputs.begin() + static_cast<int64_t>(s.num_inputs));
    if (!create_graph) {
      for (auto& x : inputs) {
        if (x.requires_grad()) x = leaf_of(x);
      }
    }
    if (s.options.recompute_fp32()) {
      // Low-precision inputs (the forward ran under autocast) go in as fp32; their gradients
      // flow back through the cast.
      std::vector<Tensor> wide;
      for (const auto& d : inputs) {
        const auto t = d.scalar_type();
        wide.push_back(t == torch::kHalf || t == torch::kBFloat16 ? d.to(torch::kFloat) : d);
      }
      outputs = s.fn(wide);
    } else {
      outputs = s.fn(inputs);
    }
  }
  if (s.options.observer()) s.options.observer()->recompute_end(s.call, outputs);
  autocast.reset();
  if (caller_rng) caller_rng->restore();
  return outputs;
}

// The recompute must give as many outputs as the forward, of the same shapes and dtypes.
void check_recompute_matches_forward(const CheckpointState& s, const std::vector<Tensor>& outputs,
                                     const variable_list& grad_outputs) {
  TORCH_CHECK(outputs.size() == grad_outputs.size(), where(s.call),
              ": the recompute returned ", outputs.size(), " outputs but the forward returned ",
              grad_outputs.size(), "; the checkpointed function must return the same outputs "
              "each time it runs");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [sizes, dtype] = s.output_meta[i];
    // recompute_fp32 widens low-precision outputs on purpose; their shapes must still agree.
    const bool widened = s.options.recompute_fp32() && outputs[i].scalar_type() == torch::kFloat;
    TORCH_CHECK(outputs[i].sizes() == c10::IntArrayRef(sizes) && (widened || outputs[i].scalar_type() == dtype),
                where(s.call), ": the recompute's output ", i, " is ", outputs[i].scalar_type(),
                outputs[i].sizes(), " but the forward's was ", dtype, c10::IntArrayRef(sizes),
                "; the checkpointed function must compute the same thing each time it runs (does it "
                "read state the forward changed?)");
  }
}

// The recomputed segment, differentiated inside the caller's own graph task rather than by a
// nested engine call (which costs a graph task, thread-local state per node and a ready queue of
// its own): its nodes run as the engine would have run them without the checkpoint -- latest
// sequence number first once every gradient into them has arrived, with their tensor, retain-grad,
// pre and post hooks, the engine's output validation, accumulation of gradients that meet -- pruned
// to the nodes that lead to a target and stopping at the targets, whose gradients are read where
// they arrive. Each node's saved tensors are released once it ran, as a backward that does not keep
// the graph does.
//
// Taken for a backward() over the whole graph (no grad(), no inputs=: the engine then runs every
// node) on the CPU (no streams to synchronise) without anomaly mode (the engine's per-node NaN
// check); anything else keeps the engine path. Returns nothing, having run nothing, when it does
// not apply.
class SegmentBackward {
 public:
  static bool applies(const std::vector<Tensor>& tensors) {
    const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
    if (exec_info == nullptr || !exec_info->empty() || torch::autograd::AnomalyMode::is_enabled()) return false;
    for (const auto& t : tensors) {
      if (t.defined() && !t.device().is_cpu()) return false;
    }
    return true;
  }

  // `roots` and `grads` are given up: the gradients are held only until the node they enter runs.
  // A target marked in `leaf_params` (a leaf the function captured) whose gradient only this
  // segment makes is accumulated here, where the segment completes it, as the engine would right
  // then; its entry in the result is undefined. `recomputed_from` is the sequence number the
  // recompute's nodes start at.
  static std::optional<std::vector<Tensor>> run(std::vector<Tensor>& roots, std::vector<Tensor>& grads,
                                                const std::vector<Tensor>& targets, c10::ArrayRef<bool> leaf_params,
                                                uint64_t recomputed_from) {
    SegmentBackward b;
    std::vector<torch::autograd::Edge> root_edges;
    root_edges.reserve(roots.size());
    for (const auto& r : roots) root_edges.push_back(torch::autograd::impl::gradient_edge(r));
    c10::SmallVector<torch::autograd::Edge, 8> target_edges;
    for (const auto& t : targets) {
      if (t.grad_fn()) {
        target_edges.emplace_back(t.grad_fn(), t.output_nr());
      } else {
        target_edges.emplace_back(torch::autograd::impl::try_get_grad_accumulator(t), 0);
      }
      if (auto* node = target_edges.back().function.get()) b.nodes_[node].target = true;
    }
    if (!b.prune(root_edges)) return std::nullopt;
    roots.clear();
    c10::SmallVector<bool, 8> accumulated(targets.size(), false);
    for (size_t k = 0; k < targets.size(); ++k) {
      if (leaf_params[k] && b.completes_here(target_edges[k], recomputed_from)) {
        b.nodes_[target_edges[k].function.get()].target = false;
        accumulated[k] = true;
      }
    }
    torch::autograd::validate_outputs(root_edges, grads, [](const std::string& msg) {
      return "ckcheck::checkpoint: " + msg;
    });
    for (size_t i = 0; i < root_edges.size(); ++i) b.deliver(root_edges[i], std::move(grads[i]));
    grads.clear();
    for (const auto& e : root_edges) {
      auto* info = b.find(e.function.get());
      if (info != nullptr && !info->target && info->needed && info->pending == 0 && !info->queued) {
        info->queued = true;
        b.ready_.push(e.function.get());
      }
    }
    while (!b.ready_.empty()) {
      auto* node = b.ready_.top();
      b.ready_.pop();
      b.evaluate(*node);
    }
    std::vector<Tensor> found;
    found.reserve(targets.size());
    for (size_t k = 0; k < targets.size(); ++k) {
      const auto* info = b.find(target_edges[k].function.get());
      const bool has = !accumulated[k] && info != nullptr && !info->buffer.empty();
      found.push_back(has ? info->buffer[target_edges[k].input_nr] : Tensor());
    }
    return found;
  }

 private:
  using Node = torch::autograd::Node;
  struct Later {
    bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
  };
  // What the walk knows of one node, in one table: a segment's nodes are few, and one lookup
  // costs less than a set or a map for each property.
  struct Info {
    bool target = false;  // its gradient is read here, not passed on
    bool needed = false;  // leads to a target
    bool queued = false;
    size_t pending = 0;  // gradients still to arrive from needed nodes
    torch::autograd::variable_list buffer;
  };

  // Node -> Info by open addressing in one array, grown to keep it at most half full: one
  // allocation for a segment's few nodes where a std::unordered_map makes one per node. An entry
  // stays where it is until the table grows, which only an insertion does.
  class NodeTable {
   public:
    NodeTable() : slots_(kInitial) {}
    Info* find(const Node* node) {
      for (size_t i = home(node);; i = (i + 1) & (slots_.size() - 1)) {
        if (slots_[i].first == node) return &slots_[i].second;
        if (slots_[i].first == nullptr) return nullptr;
      }
    }
    // The entry of `node`, and whether it was made now.
    std::pair<Info*, bool> try_emplace(Node* node) {
      if (2 * (size_ + 1) > slots_.size()) grow();
      for (size_t i = home(node);; i = (i + 1) & (slots_.size() - 1)) {
        if (slots_[i].first == node) return {&slots_[i].second, false};
        if (slots_[i].first == nullptr) {
          slots_[i].first = node;
          ++size_;
          return {&slots_[i].second, true};
        }
      }
    }
    Info& operator[](Node* node) { return *try_emplace(node).first; }
    template <typename F>
    void for_each(F&& f) {
      for (auto& [node, info] : slots_) {
        if (node != nullptr) f(node, info);
      }
    }

   private:
    static constexpr size_t kInitial = 16;  // a power of two
    size_t home(const Node* node) const {
      // Fibonacci hashing of the address; its low bits are alignment.
      const auto h = (reinterpret_cast<uintptr_t>(node) >> 4) * 0x9E3779B97F4A7C15ULL;
      return static_cast<size_t>(h >> 32) & (slots_.size() - 1);
    }
    void grow() {
      std::vector<std::pair<Node*, Info>> old(slots_.size() * 2);
      old.swap(slots_);
      size_ = 0;
      for (auto& [node, info] : old) {
        if (node != nullptr) *try_emplace(node).first = std::move(info);
      }
    }
    std::vector<std::pair<Node*, Info>> slots_;
    size_t size_ = 0;
  };

  Info* find(Node* node) { return node == nullptr ? nullptr : nodes_.find(node); }
  bool is_needed(Node* node) {
    const auto* info = find(node);
    return info != nullptr && info->needed;
  }

  // Whether a leaf's gradient accumulator may run here: no hook watches it (the engine would still
  // call them with the undefined gradient handed back) and every reference to it is known -- the
  // target's edge, the checkpoint node's edge and the recomputed nodes' edges -- so no node outside
  // the segment sends it a gradient the engine would first sum with this one.
  bool completes_here(const torch::autograd::Edge& target, uint64_t recomputed_from) {
    auto* acc = target.function.get();
    if (!is_needed(acc) || !acc->tensor_pre_hooks().empty() || !acc->pre_hooks().empty() ||
        !acc->retains_grad_hooks().empty() || !acc->post_hooks().empty() || acc->tensor_post_acc_grad_hooks()) {
      return false;
    }
    size_t known = 2;  // `target` itself and the checkpoint node's edge
    nodes_.for_each([&](Node* node, const Info& info) {  // every node the walk visited
      if (node->sequence_nr() < recomputed_from || info.target) return;
      for (const auto& e : node->next_edges()) known += e.function.get() == acc ? 1 : 0;
    });
    return static_cast<size_t>(target.function.use_count()) == known;
  }

  // Marks the nodes that lead to a target (not going past one) and counts, for each, the gradients
  // it waits for. False where a node runs off the CPU.
  bool prune(const std::vector<torch::autograd::Edge>& root_edges) {
    // Post-order walk: a node is needed when it is a target or one of its next nodes is needed. A
    // node is in the table once visited (the targets from the start).
    c10::SmallVector<std::pair<Node*, size_t>, 16> stack;
    auto visit = [this, &stack](Node* node) {
      const auto [info, fresh] = nodes_.try_emplace(node);
      if (info->target) {
        info->needed = true;
      } else if (fresh) {
        stack.emplace_back(node, 0);
      }
    };
    for (const auto& e : root_edges) {
      if (auto* root = e.function.get()) visit(root);
      while (!stack.empty()) {
        auto* node = stack.back().first;
        const size_t next = stack.back().second;
        if (next < node->num_outputs()) {
          ++stack.back().second;
          if (auto* child = node->next_edge(next).function.get()) visit(child);
          continue;
        }
        auto& info = *nodes_.find(node);
        for (const auto& e2 : node->next_edges()) {
          if (is_needed(e2.function.get())) {
            info.needed = true;
            break;
          }
        }
        stack.pop_back();
      }
    }
    bool on_cpu = true;
    nodes_.for_each([&](Node* node, const Info& info) {
      if (!info.needed || info.target) return;
      for (size_t i = 0; i < node->num_inputs(); ++i) {
        const auto& m = node->input_metadata(i);
        on_cpu = on_cpu && m.device().is_cpu() && !m.is_nested_tensor();
      }
      for (const auto& e : node->next_edges()) {
        auto* child = find(e.function.get());
        if (child != nullptr && child->needed) ++child->pending;
      }
    });
    return on_cpu;
  }

  void deliver(const torch::autograd::Edge& edge, Tensor grad) {
    if (auto* info = find(edge.function.get())) deliver(*info, edge, std::move(grad));
  }
  // `info` is the table's entry for `edge.function`, already looked up by the caller.
  static void deliver(Info& info, const torch::autograd::Edge& edge, Tensor grad) {
    if (!info.needed || !grad.defined()) return;
    auto& buffer = info.buffer;
    if (buffer.empty()) buffer.resize(edge.function->num_inputs());
    auto& slot = buffer[edge.input_nr];
    slot = slot.defined() ? slot + grad : std::move(grad);
  }

  void evaluate(Node& node) {
    auto inputs = std::move(nodes_.find(&node)->buffer);
    for (const auto& hook : node.tensor_pre_hooks()) inputs = (*hook)(inputs);
    for (const auto& [index, hook] : node.retains_grad_hooks()) inputs = (*hook)(inputs);
    for (const auto& hook : node.pre_hooks()) inputs = (*hook)(inputs);
    node.will_release_variables();
    const bool post = !node.post_hooks().empty();
    const auto kept = post ? inputs : torch::autograd::variable_list();
    auto outputs = node(std::move(inputs));
    node.release_variables();
    torch::autograd::validate_outputs(node.next_edges(), outputs, [&node](const std::string& msg) {
      return node.name() + ": " + msg;
    });
    for (const auto& hook : node.post_hooks()) outputs = (*hook)(outputs, kept);
    for (size_t i = 0; i < outputs.size(); ++i) {
      const auto& next = node.next_edge(i);
      auto* child = find(next.function.get());
      if (child == nullptr || !child->needed) continue;
      deliver(*child, next, std::move(outputs[i]));
      if (!child->target && --child->pending == 0 && !child->queued) {
        child->queued = true;
        ready_.push(next.function.get());
      }
    }
  }

  NodeTable nodes_;
  std::priority_queue<Node*, c10::SmallVector<Node*, 16>, Later> ready_;
};

// The autograd node of one call: its next edges are the caller's inputs and the captured tensors
// (known only once the function ran, so the node is made after it), its inputs the gradients of
// the function's outputs. A node of its own rather than an autograd::Function, whose context,
// saved-data map, per-argument records and output wrapping cost more than the rest of a small call.
class CheckpointNode : public torch::autograd::Node {
 public:
  CheckpointNode(CheckpointState state, torch::autograd::edge_list&& edges)
      : Node(std::move(edges)), state_(std::move(state)) {}

  std::string name() const override { return "ckcheck::CheckpointBackward"; }

  // The incoming gradients are let go of as soon as they enter the recomputed graph, instead of
  // being held through the segment's backward. An output no gradient reaches gets none (an
  // undefined gradient): its part of the segment is not differentiated, as plain autograd would
  // not run it, instead of differentiating zeros into the parameters.
  variable_list apply(variable_list&& grad_outputs) override {
    std::lock_guard<std::mutex> lock(mutex_);  // as for any node a backward may run concurrently
    return backward(grad_outputs);
  }

 private:
  variable_list backward(variable_list& grad_outputs) {
    auto& s = state_;
    refuse_released(s);
    // The backward asks for what it asks: all inputs for loss.backward(), some for
    // autograd::grad(...) or backward(inputs=...). Only those are differentiated, and the engine
    // routes the returned gradients, as it does for any node -- except a captured parameter's whose
    // gradient only this segment makes, accumulated where it is complete (SegmentBackward).
    c10::SmallVector<size_t, 8> slots;
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      if (s.inputs[i].requires_grad() && task_should_compute_output(i)) slots.push_back(i);
    }
    const bool keep_graph = torch::autograd::get_current_graph_task_keep_graph();
    // Under create_graph the engine runs backward with grad mode on: the gradients then carry the
    // recomputed graph, which reaches the inputs themselves, so a second derivative is exact.
    const bool create_graph = torch::GradMode::is_enabled();
    std::vector<Tensor> buffers = begin_recompute(s, grad_outputs);  // put back once gradients have flowed
    if (create_graph) refuse_dependent_inputs(s, slots);
    std::vector<Tensor> recompute_inputs;
    const uint64_t recomputed_from = at::sequence_number::peek();
    std::vector<Tensor> outputs = recompute(s, create_graph, recompute_inputs);
    check_recompute_matches_forward(s, outputs, grad_outputs);
    std::vector<Tensor> roots, grads;
    roots.reserve(outputs.size());
    grads.reserve(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(std::move(outputs[i]));
        grads.push_back(std::move(grad_outputs[i]));
      }
    }
    outputs.clear();
    grad_outputs.clear();
    variable_list result(s.inputs.size());  // one per edge
    if (!roots.empty() && !slots.empty()) {
      const auto found = gradients(s, roots, grads, slots, recompute_inputs, recomputed_from, create_graph);
      for (size_t k = 0; k < slots.size(); ++k) result[slots[k]] = found[k];
    }
    end_recompute(s, buffers, keep_graph);
    return result;
  }

  // Before the recompute: the buffers to put back (copies of their forward values), the observer
  // told, the inputs' versions checked.
  static std::vector<Tensor> begin_recompute(CheckpointState& s, const variable_list& grad_outputs) {
    std::vector<Tensor> buffers;
    if (!s.options.restore_buffers().empty()) {
      Quiet quiet;
      for (const auto& b : s.options.restore_buffers()) buffers.push_back(b.detach().clone());
    }
    if (s.options.observer()) {
      const std::vector<Tensor> caller_inputs(s.inputs.begin(), s.inputs.begin() + static_cast<int64_t>(s.num_inputs));
      s.options.observer()->recompute_begin(s.call, caller_inputs, grad_outputs);
    }
    if (s.options.check_input_versions()) check_inputs_unchanged(s);
    return buffers;
  }

  // The gradients of the slots' tensors, through the recomputed graph: walked here where that
  // applies (SegmentBackward), else by a nested engine call.
  static std::vector<Tensor> gradients(const CheckpointState& s, std::vector<Tensor>& roots, std::vector<Tensor>& grads,
                                       c10::ArrayRef<size_t> slots, const std::vector<Tensor>& recompute_inputs,
                                       uint64_t recomputed_from, bool create_graph) {
    std::vector<Tensor> targets;
    c10::SmallVector<bool, 8> leaf_params;
    targets.reserve(slots.size());
    for (const auto i : slots) {
      targets.push_back(i < s.num_inputs ? recompute_inputs[i] : s.inputs[i]);
      leaf_params.push_back(i >= s.num_inputs && s.inputs[i].is_leaf());
    }
    if (!create_graph && SegmentBackward::applies(grads) && SegmentBackward::applies(targets)) {
      if (auto found = SegmentBackward::run(roots, grads, targets, leaf_params, recomputed_from)) return *found;
    }
    std::vector<Tensor> outside;  // the tensors of the caller's graph among the targets
    for (const auto i : slots) {
      if (i >= s.num_inputs || create_graph) outside.push_back(s.inputs[i]);
    }
    HooksSetAside aside(outside);
    return torch::autograd::grad(roots, targets, grads, /*retain_graph=*/create_graph, create_graph,
                                 /*allow_unused=*/true);
  }

  // After the gradients: the buffers put back, the saved activations released.
  static void end_recompute(CheckpointState& s, const std::vector<Tensor>& buffers, bool keep_graph) {
    if (!buffers.empty()) {
      // Only now: the recomputed graph may have saved these very tensors (batch_norm does), and
      // writing them earlier would fail its version check.
      torch::NoGradGuard no_grad;
      Quiet quiet;
      for (size_t i = 0; i < buffers.size(); ++i) s.options.restore_buffers()[i].copy_(buffers[i]);
    }
    if (!keep_graph) {
      // Release the saved activations now, as autograd does for saved tensors.
      s.consumed = true;
      s.inputs.clear();
      s.fn = nullptr;  // and what the function holds
    }
  }

  CheckpointState state_;
};

}  // namespace
}  // namespace ckcheck

namespace ckcheck {
namespace {

// The function run without autograd (nothing inside it is kept for the backward), watched for
// the tensors it reads from outside; returns its outputs and fills `captured`.
std::vector<Tensor> run_function(CheckpointState& s, const std::vector<Tensor>& inputs, bool grad_mode,
                                 std::vector<Tensor>& captured) {
  torch::NoGradGuard no_grad;
  std::optional<CapturedTensors> watch;
  if (grad_mode) watch.emplace(inputs);
  const auto& observer = s.options.observer();
  const auto entry_versions = s.options.check_input_versions() ? versions_of(inputs) : Versions();
  if (observer) observer->forward_begin(s.call, inputs);
  auto outputs = s.fn(inputs);
  if (observer) observer->forward_end(s.call, inputs, outputs);
  if (watch) captured = watch->take();
  if (grad_mode) {
    // An output that requires grad and was not made by the function is a tensor from outside
    // returned as is (a parameter): read from outside like any captured tensor, so that its
    // gradient reaches it through the node.
    for (const auto& out : outputs) {
      if (out.defined() && out.requires_grad() && !watch->made_inside(out) && !shares_impl(out, inputs) &&
          !shares_impl(out, captured)) {
        captured.push_back(out);
      }
    }
  }
  captured = settle_dependent_captures(s.call, std::move(captured));
  for (size_t i = 0; i < entry_versions.size(); ++i) {
    const auto exit_version = static_cast<int64_t>(inputs[i]._version());
    TORCH_CHECK(exit_version == entry_versions[i], where(s.call), ": the checkpointed function changed its input ",
                i, " in place (version ", entry_versions[i], " -> ", exit_version,
                "), so the recompute would start from other data and the gradients would be "
                "wrong; clone the input before changing it, or move the in-place op out of "
                "the checkpointed segment");
  }
  return outputs;
}

// Each output a tensor of its own, its size and dtype kept for the recompute's check (run Quiet).
void own_outputs(CheckpointState& s, std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& captured) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto& out = outputs[i];
    TORCH_CHECK(out.defined(), where(s.call), ": output ", i,
                " of the checkpointed function is an undefined tensor; return defined tensors only");
    // A view (of an input, or of an intermediate changed in place, pytorch#26546) would be
    // rebased by autograd's view logic onto a graph that bypasses this checkpoint's backward, and
    // a tensor from outside returned as is would alias it: hand out a tensor of its own instead.
    if (out.is_view() || out.requires_grad() || shares_impl(out, inputs) || shares_impl(out, captured)) {
      torch::NoGradGuard no_grad;
      out = out.clone();
    }
    s.output_meta.emplace_back(out.sizes(), out.scalar_type());
  }
}

// The call itself; `fn` is taken by value and moved into the state, not copied again.
std::vector<Tensor> checkpoint_call(TensorsFn fn, const std::vector<Tensor>& inputs, const CheckpointOptions& options) {
  CheckpointState s;
  s.fn = std::move(fn);
  s.options = options;
  s.call = CheckpointCall{options.name(), next_call_id++};
  s.num_inputs = inputs.size();
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(inputs[i].defined(), where(s.call), ": input ", i, " is an undefined tensor; pass defined tensors only");
  }
  const bool grad_mode = torch::GradMode::is_enabled();
  if (s.options.preserve_rng_state()) s.rng = RngFork::capture();
  s.autocast = AutocastState::capture();
  std::vector<Tensor> captured;
  std::vector<Tensor> outputs = run_function(s, inputs, grad_mode, captured);
  Quiet quiet;
  own_outputs(s, outputs, inputs, captured);
  s.inputs.reserve(inputs.size() + captured.size());
  s.inputs.insert(s.inputs.end(), inputs.begin(), inputs.end());
  s.inputs.insert(s.inputs.end(), captured.begin(), captured.end());
  // Autograd reaches the node only where it would have reached the function: under grad mode, from
  // a tensor that requires grad.
  const bool differentiable =
      grad_mode && std::any_of(s.inputs.begin(), s.inputs.end(), [](const Tensor& t) { return t.requires_grad(); });
  if (!differentiable) return outputs;
  s.versions = versions_of(s.inputs);
  auto edges = torch::autograd::collect_next_edges(s.inputs);
  auto node = c10::make_intrusive<CheckpointNode>(std::move(s), std::move(edges));
  for (auto& out : outputs) {
    // Integer and boolean outputs get no gradient; their slot in the node stays empty.
    if (out.is_floating_point() || out.is_complex()) {
      torch::autograd::create_gradient_edge(out, node);
    } else {
      node->add_input_metadata(torch::autograd::Node::undefined_input());
    }
  }
  return outputs;
}

}  // namespace

std::vector<Tensor> checkpoint(const TensorsFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options) {
  return checkpoint_call(fn, inputs, options);
}

Tensor checkpoint(const TensorFn& fn, const Tensor& input, const CheckpointOptions& options) {
  auto outputs = checkpoint_call(
      [fn](const std::vector<Tensor>& xs) { return std::vector<Tensor>{fn(xs[0])}; }, {input}, options);
  return outputs[0];
}

namespace {

// Tensors inside an IValue, in order, and a function that rebuilds the IValue from replacements.
void flatten_tensors(const c10::IValue& v, std::vector<Tensor>& out, const std::string& path,
                     const std::string& site, bool outputs) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    for (size_t i = 0; i < elems.size(); ++i) {
      flatten_tensors(elems[i], out, fmt::format("{}[{}]", path, i), site, outputs);
    }
  } else if (v.isList()) {
    auto list = v.toList();
    for (size_t i = 0; i < list.size(); ++i) {
      flatten_tensors(list.get(i), out, fmt::format("{}[{}]", path, i), site, outputs);
    }
  } else if (outputs) {
    TORCH_CHECK(false, site, ": the checkpointed function returned a ", v.tagKind(), " at ", path,
                "; only tensors, and tuples or lists of tensors, can be checkpointed; return the "
                "value from outside the checkpointed function");
  }
}

c10::IValue rebuild(const c10::IValue& v, const std::vector<Tensor>& tensors, size_t& next) {
  if (v.isTensor()) return tensors.at(next++);
  if (v.isTuple()) {
    std::vector<c10::IValue> elems;
    for (const auto& e : v.toTupleRef().elements()) elems.push_back(rebuild(e, tensors, next));
    return c10::ivalue::Tuple::create(std::move(elems));
  }
  if (v.isList()) {
    auto list = v.toList();
    auto copy = c10::impl::GenericList(list.elementType());
    for (size_t i = 0; i < list.size(); ++i) copy.push_back(rebuild(list.get(i), tensors, next));
    return copy;
  }
  return v;
}

}  // namespace

c10::IValue checkpoint_ivalues(const IValuesFn& fn, const std::vector<c10::IValue>& inputs,
                               const CheckpointOptions& options) {
  const std::string site = where(CheckpointCall{options.name(), 0});
  std::vector<Tensor> tensors;
  for (size_t i = 0; i < inputs.size(); ++i) {
    flatten_tensors(inputs[i], tensors, fmt::format("input {}", i), site, false);
  }
  // The output's structure, recorded by the forward and used to rebuild the result.
  auto structure = std::make_shared<c10::IValue>();
  auto tensor_fn = [fn, inputs, structure, site](const std::vector<Tensor>& xs) {
    std::vector<c10::IValue> args;
    size_t next = 0;
    for (const auto& in : inputs) args.push_back(rebuild(in, xs, next));
    c10::IValue result = fn(args);
    std::vector<Tensor> outs;
    flatten_tensors(result, outs, "output", site, true);
    *structure = result;
    return outs;
  };
  auto outs = checkpoint_call(std::move(tensor_fn), tensors, options);
  size_t next = 0;
  return rebuild(*structure, outs, next);
}

Tensor checkpoint_sequential(const torch::nn::Sequential& modules, int64_t segments,
                             const Tensor& input, const CheckpointOptions& options) {
  const auto n = static_cast<int64_t>(modules->size());
  TORCH_CHECK(segments >= 1 && segments <= std::max<int64_t>(n, 1),
              "ckcheck::checkpoint_sequential: segments must be between 1 and the number of "
              "modules (",
              n, "), got ", segments);
  const int64_t per = (n + segments - 1) / segments;
  auto run = [modules](int64_t begin, int64_t end) {
    return [modules, begin, end](const Tensor& x) {
      torch::nn::Sequential seq = modules;
      Tensor y = x;
      for (int64_t i = begin; i < end; ++i) y = (seq->begin() + i)->forward(y);
      return y;
    };
  };
  Tensor x = input;
  int64_t begin = 0;
  for (int64_t seg = 0; begin < n; ++seg) {
    const int64_t end = std::min(n, begin + per);
    if (end < n) {
      auto opts = options;
      opts.name(fmt::format("{}{}segment {}", options.name(), options.name().empty() ? "" : ".", seg));
      x = checkpoint(TensorFn(run(begin, end)), x, opts);
    } else {
      x = run(begin, end)(x);
    }
    begin = end;
  }
  return x;
}

bool is_recomputing() { return recompute_depth > 0; }

}  // namespace ckcheck
