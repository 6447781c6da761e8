#include "ckcheck/checkpoint.h"

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <atomic>
#include <optional>

#include "harness/support/global_state.h"

namespace ckcheck {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local int recompute_depth = 0;
std::atomic<int64_t> next_call_id{0};

struct RecomputeMark {
  RecomputeMark() { ++recompute_depth; }
  ~RecomputeMark() { --recompute_depth; }
};

// Everything the backward needs, held by the autograd node through a capsule in saved_data. The
// inputs are held here rather than through save_for_backward so that a changed input is reported
// with the checkpoint's own error (site and input index) instead of the saved-variable one.
struct CheckpointState : torch::CustomClassHolder {
  TensorsFn fn;
  CheckpointOptions options;
  CheckpointCall call;
  size_t num_inputs = 0;  // the caller's inputs
  bool dummy = false;     // a trailing zero-size input that requires grad follows them
  std::vector<Tensor> inputs;
  std::vector<int64_t> versions;
  // Each forward output's shape and dtype: the recompute must reproduce them.
  std::vector<std::pair<std::vector<int64_t>, c10::ScalarType>> output_meta;
  std::optional<RngState> rng;
  AutocastState autocast;
  bool consumed = false;
};

std::string where(const CheckpointCall& call) {
  return call.site.empty() ? std::string("ckcheck::checkpoint")
                           : fmt::format("ckcheck::checkpoint({})", call.site);
}

std::vector<int64_t> versions_of(const std::vector<Tensor>& tensors) {
  std::vector<int64_t> v;
  v.reserve(tensors.size());
  for (const auto& t : tensors) v.push_back(t.defined() ? static_cast<int64_t>(t._version()) : -1);
  return v;
}

bool shares_impl(const Tensor& t, const std::vector<Tensor>& others) {
  for (const auto& o : others) {
    if (o.defined() && o.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return true;
  }
  return false;
}

// What the backward refuses before it computes anything.
void refuse_unsupported_backward(const CheckpointState& s) {
  TORCH_CHECK(!s.consumed, where(s.call),
              ": backward ran a second time through the same checkpoint; the checkpoint "
              "releases its inputs after the first backward, so run the forward again for each "
              "backward (retain_graph=true is not supported)");
  // The recompute runs a nested backward over the whole recomputed graph, which accumulates
  // into every parameter inside the function. That is the step's ordinary backward, but not
  // what grad() or backward(inputs=...) asked for: refuse those before anything is computed, as
  // torch.utils.checkpoint(use_reentrant=True) does, rather than fill .grad behind their back.
  TORCH_CHECK(torch::autograd::Engine::get_default_engine().is_checkpoint_valid(), where(s.call),
              ": torch::autograd::grad() and backward(inputs=...) are not supported through a "
              "checkpoint (its recompute would also fill .grad of every parameter inside); call "
              "backward() on the loss with no inputs, or leave this segment un-checkpointed");
  // Under create_graph the gradients would have to carry a graph back to the caller's inputs;
  // the recompute starts from detached copies of them, so refuse instead of returning
  // gradients whose second derivative is silently missing.
  TORCH_CHECK(!torch::GradMode::is_enabled(), where(s.call),
              ": double backward (create_graph=true) is not supported through a checkpoint; "
              "compute higher-order gradients without checkpointing this segment");
}

void check_inputs_unchanged(const CheckpointState& s) {
  const auto now = versions_of(s.inputs);
  for (size_t i = 0; i < now.size(); ++i) {
    TORCH_CHECK(now[i] == s.versions[i], where(s.call), ": input ", i,
                " was changed in place after the forward (version ", s.versions[i], " -> ", now[i],
                "), so the recompute would start from other data; clone the tensor before "
                "changing it, or do not checkpoint this segment");
  }
}

// The function again, from the detached inputs, under the forward's RNG and autocast state.
std::vector<Tensor> recompute(const CheckpointState& s, const std::vector<Tensor>& detached) {
  // Fork the RNG: replay the forward's state for the recompute, then give the caller back the
  // state it had, so that checkpointing leaves the random stream of the step unchanged.
  std::optional<RngState> caller_rng;
  if (s.rng) {
    at::DisableRecordFunctionGuard quiet;
    caller_rng = RngState::capture();
    s.rng->restore();
  }
  std::optional<AutocastScope> autocast;
  if (s.options.recompute_fp32()) {
    auto off = s.autocast;
    off.cpu_enabled = off.cuda_enabled = false;
    autocast.emplace(off);
  } else if (s.options.restore_autocast()) {
    autocast.emplace(s.autocast);
  }
  std::vector<Tensor> outputs;
  {
    RecomputeMark mark;
    torch::AutoGradMode grad(true);
    if (s.options.recompute_fp32()) {
      // Low-precision inputs (the forward ran under autocast) go in as fp32; their gradients
      // flow back through the cast.
      std::vector<Tensor> wide;
      for (const auto& d : detached) {
        const auto t = d.scalar_type();
        wide.push_back(t == torch::kHalf || t == torch::kBFloat16 ? d.to(torch::kFloat) : d);
      }
      outputs = s.fn(wide);
    } else {
      outputs = s.fn(detached);
    }
  }
  if (s.options.observer()) s.options.observer()->recompute_end(s.call, outputs);
  autocast.reset();
  if (caller_rng) {
    at::DisableRecordFunctionGuard quiet;
    caller_rng->restore();
  }
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
    TORCH_CHECK(outputs[i].sizes().vec() == sizes && (widened || outputs[i].scalar_type() == dtype),
                where(s.call), ": the recompute's output ", i, " is ", outputs[i].scalar_type(),
                outputs[i].sizes(), " but the forward's was ", dtype, c10::IntArrayRef(sizes),
                "; the checkpointed function must compute the same thing each time it runs (does it "
                "read state the forward changed?)");
  }
}

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<CheckpointState> state,
                               at::TensorList args) {
    auto& s = *state;
    std::vector<Tensor> inputs(args.begin(), args.begin() + static_cast<int64_t>(s.num_inputs));
    {
      // The checkpoint's own bookkeeping is not the function's work: keep it out of op traces.
      at::DisableRecordFunctionGuard quiet;
      if (s.options.preserve_rng_state()) s.rng = RngState::capture();
    }
    s.autocast = AutocastState::capture();

    const auto& observer = s.options.observer();
    const auto entry_versions = versions_of(inputs);
    if (observer) observer->forward_begin(s.call, inputs);
    std::vector<Tensor> outputs = s.fn(inputs);
    if (observer) observer->forward_end(s.call, inputs, outputs);

    s.versions = versions_of(inputs);
    if (s.options.check_input_versions()) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        TORCH_CHECK(s.versions[i] == entry_versions[i], where(s.call),
                    ": the checkpointed function changed its input ", i,
                    " in place (version ", entry_versions[i], " -> ", s.versions[i],
                    "), so the recompute would start from other data and the gradients would be "
                    "wrong; clone the input before changing it, or move the in-place op out of "
                    "the checkpointed segment");
      }
    }

    at::DisableRecordFunctionGuard quiet;
    std::vector<Tensor> non_differentiable;
    for (size_t i = 0; i < outputs.size(); ++i) {
      auto& out = outputs[i];
      TORCH_CHECK(out.defined(), where(s.call), ": output ", i,
                  " of the checkpointed function is an undefined tensor; return defined tensors "
                  "only");
      // A view (of an input, or of an intermediate changed in place, pytorch#26546) would be
      // rebased by autograd's view logic onto a graph that bypasses this checkpoint's backward, and
      // an input returned as is would alias it: hand out a tensor of its own instead.
      if (out.is_view() || shares_impl(out, inputs)) out = out.clone();
      if (!out.is_floating_point() && !out.is_complex()) non_differentiable.push_back(out);
    }
    ctx->mark_non_differentiable(non_differentiable);
    for (const auto& out : outputs) s.output_meta.emplace_back(out.sizes().vec(), out.scalar_type());

    s.inputs = std::move(inputs);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(
        ctx->saved_data["state"].toCapsule());
    auto& s = *state;
    refuse_unsupported_backward(s);
    s.consumed = true;
    std::vector<Tensor> detached;
    std::vector<Tensor> buffers;  // values the forward left, put back once gradients have flowed
    {
      at::DisableRecordFunctionGuard quiet;
      detached.reserve(s.inputs.size());
      for (const auto& x : s.inputs) {
        auto d = x.detach();
        d.requires_grad_(x.requires_grad());
        detached.push_back(d);
      }
      for (const auto& b : s.options.restore_buffers()) buffers.push_back(b.detach().clone());
    }
    if (s.options.observer()) s.options.observer()->recompute_begin(s.call, s.inputs, grad_outputs);
    if (s.options.check_input_versions()) check_inputs_unchanged(s);

    const std::vector<Tensor> outputs = recompute(s, detached);
    check_recompute_matches_forward(s, outputs, grad_outputs);
    std::vector<Tensor> roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    if (!buffers.empty()) {
      // Only now: the recomputed graph may have saved these very tensors (batch_norm does), and
      // writing them earlier would fail its version check.
      torch::NoGradGuard no_grad;
      at::DisableRecordFunctionGuard quiet;
      for (size_t i = 0; i < buffers.size(); ++i) s.options.restore_buffers()[i].copy_(buffers[i]);
    }

    variable_list result;
    result.reserve(2 + s.inputs.size());
    result.emplace_back();  // the state argument
    for (const auto& d : detached) result.push_back(d.requires_grad() ? d.grad() : Tensor());
    if (s.dummy) result.emplace_back();
    s.inputs.clear();  // release the saved activations now, as autograd does for saved tensors
    return result;
  }
};

}  // namespace

std::vector<Tensor> checkpoint(const TensorsFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options) {
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->options = options;
  state->call = CheckpointCall{options.name(), next_call_id++};
  state->num_inputs = inputs.size();
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(inputs[i].defined(), where(state->call), ": input ", i,
                " is an undefined tensor; pass defined tensors only");
  }

  std::vector<Tensor> args = inputs;
  bool any_requires_grad = false;
  for (const auto& x : inputs) any_requires_grad = any_requires_grad || x.requires_grad();
  // When no input requires grad the autograd node would not be recorded and the parameters inside
  // the function would get no gradient (the reentrant pitfall behind Hugging Face's
  // enable_input_require_grads). A zero-size tensor that requires grad keeps the node in the graph.
  const bool dummy = torch::GradMode::is_enabled() && !any_requires_grad;
  if (dummy) args.push_back(torch::empty({0}, torch::requires_grad()));
  state->dummy = dummy;

  auto outputs = CheckpointFunction::apply(state, at::TensorList(args));
  return outputs;
}

Tensor checkpoint(const TensorFn& fn, const Tensor& input, const CheckpointOptions& options) {
  auto outputs = checkpoint(
      [fn](const std::vector<Tensor>& xs) { return std::vector<Tensor>{fn(xs[0])}; },
      std::vector<Tensor>{input}, options);
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
  auto outs = checkpoint(tensor_fn, tensors, options);
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
