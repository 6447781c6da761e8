// ckcheck::checkpoint: activation checkpointing for LibTorch, which has none of its own
// (pytorch/pytorch#52744).
//
// The forward runs the function under no-grad and keeps only its inputs; the backward recomputes
// it under grad mode -- with the forward's RNG state and autocast state put back -- and
// differentiates the recomputed graph (the "reentrant" design of torch.utils.checkpoint,
// use_reentrant=True). Unlike that design it gives the backward what plain autograd would:
//   - the autograd node's inputs are the function's inputs and every tensor requiring grad that
//     the function reads from outside (its parameters, tensors of the caller's graph it captures),
//     found while the forward runs; so parameters get their gradients when no input requires grad,
//     and a captured tensor's graph runs once, after all its uses. A function may turn grad mode
//     back on inside itself (forces as the gradient of an energy, a checkpoint within it): what
//     it computes there is its own, not read from outside. A parameter it reads whose result the
//     loss does not use gets no gradient, as in plain autograd (its gradient hooks see none);
//   - the backward differentiates only what the engine asks for and accumulates nothing itself:
//     `loss.backward()`, `torch::autograd::grad(...)` (nothing accumulated into any .grad) and
//     `backward(..., inputs={...})` (only those leaves) all give plain autograd's results;
//   - under create_graph=true the recomputed graph reaches the inputs themselves, so double
//     backward (gradient penalties) is exact;
//   - a second backward works while the graph is kept (retain_graph=true), as without it.
// It refuses, with a c10::Error whose first line names the checkpoint and the way out, what it
// cannot do correctly: an input (or a tensor it reads from outside) changed in place, a backward
// after one that released the graph, a recompute of another shape, a non-tensor output.
//
//   #include <ckcheck/checkpoint.h>
//   auto y = ckcheck::checkpoint([&](const torch::Tensor& x) { return block->forward(x); }, x);
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ckcheck {

/// Identifies one checkpointed call: the site label given in the options and a serial number that
/// is unique within the process.
struct CheckpointCall {
  std::string site;
  int64_t id = 0;
};

/// Watches checkpointed calls without the checkpoint knowing what watches it. All methods run on
/// the thread that runs the forward or the recompute; the default implementations do nothing.
class CheckpointObserver {
 public:
  virtual ~CheckpointObserver() = default;
  /// Before the function runs in the forward; `inputs` are the caller's tensors.
  virtual void forward_begin(const CheckpointCall& call, const std::vector<torch::Tensor>& inputs) {}
  /// After it ran, before the checkpoint validates its inputs.
  virtual void forward_end(const CheckpointCall& call, const std::vector<torch::Tensor>& inputs,
                           const std::vector<torch::Tensor>& outputs) {}
  /// When backward reaches the checkpoint, before any validation: `inputs` are the saved inputs as
  /// they are now (the same tensors the forward saw), `grad_outputs` the incoming gradients
  /// (undefined where none flows).
  virtual void recompute_begin(const CheckpointCall& call, const std::vector<torch::Tensor>& inputs,
                               const std::vector<torch::Tensor>& grad_outputs) {}
  /// After the function ran again, before gradients flow through the recomputed graph.
  virtual void recompute_end(const CheckpointCall& call,
                             const std::vector<torch::Tensor>& outputs) {}
  /// Gradients that reached the call's outputs, for a checkpoint that learns them only after
  /// recompute_begin (PyTorch's, seen from outside); each call may come several times.
  virtual void output_grads(const CheckpointCall& call, const std::vector<torch::Tensor>& grads) {}
};

/// Options of ckcheck::checkpoint, named after torch.utils.checkpoint's arguments where one exists.
///
///   ckcheck::CheckpointOptions().preserve_rng_state(false).name("blocks.3")
struct CheckpointOptions {
  CheckpointOptions() = default;

  /// Save the CPU generator and the default generator of every initialised CUDA device (not only
  /// the devices of the inputs) before the forward and replay them in the recompute, so dropout
  /// draws the same mask. Default: true.
  ///   CheckpointOptions().preserve_rng_state(false)  // the hazard, for tests that must catch it
  TORCH_ARG(bool, preserve_rng_state) = true;

  /// Run the recompute with the forward's autocast state: CPU and CUDA enabled flags, their dtypes
  /// and the cache flag. Without it the recompute runs with whatever state the backward thread has
  /// (usually autocast off). Default: true.
  ///   CheckpointOptions().restore_autocast(false)
  TORCH_ARG(bool, restore_autocast) = true;

  /// Run the recompute with autocast off and half/bfloat16 inputs widened to fp32, whatever the
  /// forward ran with: the "keep the recompute in fp32" mitigation. The recompute then computes
  /// other values than the forward did; ckcheck's autocast check measures what that costs.
  /// Default: false.
  ///   CheckpointOptions().recompute_fp32(true)
  TORCH_ARG(bool, recompute_fp32) = false;

  /// Refuse, with an error naming the input, when the function changes one of its inputs in place
  /// or an input is changed between the forward and the recompute: the recompute would start from
  /// other data and the gradients would be silently wrong. Default: true.
  ///   CheckpointOptions().check_input_versions(false)
  TORCH_ARG(bool, check_input_versions) = true;

  /// Tensors (a module's buffers, such as BatchNorm's running statistics) whose values are put back
  /// after the recompute, so state the function updates is updated once per step, not twice.
  /// Default: none.
  ///   CheckpointOptions().restore_buffers({bn->running_mean, bn->running_var})
  TORCH_ARG(std::vector<torch::Tensor>, restore_buffers) = {};

  /// A label for errors and observers, such as the module path. Default: "".
  ///   CheckpointOptions().name("blocks.3")
  TORCH_ARG(std::string, name) = "";

  /// Watches the forward and the recompute of this call. Default: none.
  TORCH_ARG(std::shared_ptr<CheckpointObserver>, observer) = nullptr;
};

using TensorsFn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;
using TensorFn = std::function<torch::Tensor(const torch::Tensor&)>;
using IValuesFn = std::function<c10::IValue(const std::vector<c10::IValue>&)>;

/// Checkpoints `fn` over several tensor inputs and outputs. Outputs that are not floating point,
/// or that do not depend on anything requiring grad, simply get no gradient. Under grad mode, when
/// no input requires grad, the outputs still do, so that the parameters inside get theirs.
std::vector<torch::Tensor> checkpoint(const TensorsFn& fn, const std::vector<torch::Tensor>& inputs,
                                      const CheckpointOptions& options = {});

/// Checkpoints a one-tensor function.
torch::Tensor checkpoint(const TensorFn& fn, const torch::Tensor& input,
                         const CheckpointOptions& options = {});

/// Checkpoints a function over IValues (what TorchScript methods take and return). Inputs may be
/// any IValue; tensors among them are the checkpoint's inputs. The output must be a tensor or a
/// (nested) tuple or list of tensors; anything else is refused with an error.
c10::IValue checkpoint_ivalues(const IValuesFn& fn, const std::vector<c10::IValue>& inputs,
                               const CheckpointOptions& options = {});

/// Like torch.utils.checkpoint.checkpoint_sequential: splits `modules` into `segments` runs of
/// consecutive modules and checkpoints each run but the last, which runs plainly (its activations
/// are needed at once by the backward anyway).
torch::Tensor checkpoint_sequential(const torch::nn::Sequential& modules, int64_t segments,
                                    const torch::Tensor& input,
                                    const CheckpointOptions& options = {});

/// True while a checkpoint recomputes its function on this thread: a module can skip work that
/// must happen once per step (updating running statistics, counting calls).
bool is_recomputing();

}  // namespace ckcheck
