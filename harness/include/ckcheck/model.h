// The Model interface: what ckcheck needs from a model, whether it is a built-in fixture, a
// TorchScript file or a user's C++ module.
#pragma once

#include <torch/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckcheck/checkpoint.h"

namespace ckcheck {

using SiteFn = TensorsFn;
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// How a model's forward calls its checkpoint sites. The runner behind it decides, per site,
/// whether the call is plain or checkpointed; the model does not know.
class SiteRunner {
 public:
  virtual ~SiteRunner() = default;

  /// Calls `fn(inputs)` as the site `site` (a module path such as "blocks.3.attn").
  virtual std::vector<torch::Tensor> call(const std::string& site, const SiteFn& fn,
                                          const std::vector<torch::Tensor>& inputs) = 0;

  /// One-tensor form of call().
  torch::Tensor call(const std::string& site, const TensorFn& fn, const torch::Tensor& x);

  /// Runs consecutive sites as a chain, x -> fns[0] -> fns[1] -> ... A plan may checkpoint a run
  /// of several of them as one segment (the `segments:N` policy); by default each is call()ed.
  virtual torch::Tensor chain(const std::vector<std::string>& sites,
                              const std::vector<TensorFn>& fns, const torch::Tensor& x);

  /// True when this forward checkpoints some unit: a model that checkpoints itself (its own
  /// switch, as Hugging Face's gradient_checkpointing_enable) turns its switch on then.
  virtual bool checkpointing() const { return false; }

  /// The sites this forward checkpoints (each a unit of its own): what a model that applies the
  /// checkpoints itself -- inside a compiled graph, where no call can reach the runner -- reads
  /// before its forward. Empty when it checkpoints none.
  virtual std::vector<std::string> checkpointed_sites() const { return {}; }

  /// Under a budget:F policy, F: the compiler's activation memory budget decides what a compiled
  /// model's backward recomputes, and no module is checkpointed. nullopt otherwise.
  virtual std::optional<double> compiler_budget() const { return std::nullopt; }
  /// Under a sac:OPS policy, the ops every checkpointed unit saves (comma-separated, as --sac-save
  /// takes them; every other op is recomputed); "" otherwise.
  virtual std::string sac_save() const { return ""; }
};

/// Calls every site plainly: the reference run.
class PlainSiteRunner : public SiteRunner {
 public:
  using SiteRunner::call;
  std::vector<torch::Tensor> call(const std::string& site, const SiteFn& fn,
                                  const std::vector<torch::Tensor>& inputs) override {
    return fn(inputs);
  }
};

/// All the state of a model that a step can change, by name: parameters, buffers and anything
/// else the model holds (a private generator's state, a counter kept in a member).
struct ModelState {
  NamedTensors tensors;
  /// Attributes that are not tensors of the model's own (numbers, flags, containers, tensors held
  /// as plain attributes), deep copies by name, for models that have them (TorchScript).
  std::vector<std::pair<std::string, c10::IValue>> values;
};

/// What a piece of model state is, as records and findings name it.
namespace state_kind {
constexpr const char* kBuffer = "buffer";              // a registered buffer
constexpr const char* kTensorAttribute = "attribute";  // a tensor kept as a plain attribute
constexpr const char* kScalarAttribute = "scalar";     // a number, flag or string attribute
constexpr const char* kMode = "mode";                  // a module's training flag
constexpr const char* kExtra = "extra";                // other state a C++ model declares
constexpr const char* kParameter = "parameter";        // a parameter's value, where the step changed it in place
constexpr const char* kGlobal = "global";              // a module-level variable of the model's own code
}  // namespace state_kind
/// True for the record kinds above (state compared after the step by the buffers check).
bool is_state_kind(const std::string& kind);
/// "buffer", "tensor attribute", "scalar attribute", "training flag", "parameter", "state": for
/// messages.
std::string state_kind_words(const std::string& kind);
/// The name a report shows for a state tensor: extra state without its leading '@'.
std::string state_display_name(const std::string& name);

/// Analytic activation memory of one site, in bytes.
struct SiteMemory {
  double stored = 0.0;  // what the site's forward keeps for its backward
  double input = 0.0;   // its input: what a checkpoint keeps instead
};

/// A random op that a compiled backward runs again, as the compiled graph shows it.
struct CompiledRandomOp {
  std::string site;    // the module it belongs to ("blocks.0.drop"); "" when the graph does not say
  std::string op;      // the graph's op ("prims.inductor_random.default")
  std::string source;  // the user's code that made it ("torch.randn_like(h)", model.py:12), when known
};

/// What a model trained through a compiler (a Python model under --compile) saw of its compiled
/// steps: how they were compiled, and what the compiled graphs of the plain and the checkpointed
/// step hold. The runner's reference is the compiled plain step; the eager step is compared here.
struct CompiledSteps {
  std::string mode = "default";  // torch.compile's mode
  double memory_budget = 1.0;    // the compiler's activation memory budget in the checkpointed step
  /// The checkpointed step is one compiled whole that does not depend on which units a plan names
  /// (the model's own switch, or the budget alone): its units cannot be checkpointed one at a time.
  bool whole_graph = false;
  double compile_seconds = 0.0;  // compiling both steps (their first runs)
  int64_t plain_graphs = 0, checkpointed_graphs = 0;  // forward graphs: graph breaks + 1
  std::vector<std::string> graph_breaks;              // why Dynamo broke the graphs, both steps
  int64_t plain_saved = 0, checkpointed_saved = 0;    // tensors the forward graphs save for backward
  /// Bytes of the activations the compiled forward saves for backward (the compiler's own estimate,
  /// from its graphs; parameters and inputs aside): the plain step's, and the step run last's.
  int64_t plain_saved_bytes = 0, last_saved_bytes = 0;
  int64_t plain_backward_random = 0;                  // random ops in the plain step's backward graphs
  /// Random ops the checkpointed step's backward runs again with new random numbers (seeds it draws
  /// itself), and how many it runs again on the forward's seeds (replayed).
  std::vector<CompiledRandomOp> recomputed_random;
  int64_t replayed_random = 0;
  // The eager plain step against the compiled plain step: the reference for the math.
  bool eager_compared = false;
  std::string eager_note;      // why it was not compared ("" when it was)
  double eager_max_rel = 0.0;  // largest difference relative to the tensor's largest magnitude
  std::string eager_worst;     // the tensor it was found in
  double eager_tolerance = 0.0;
};

/// Activations offloaded (--offload, a Python model): the checkpointed step runs with the
/// offload's saved-tensor hooks (every tensor autograd saves is packed away in the forward and
/// brought back in the backward). Its truth: the plain step with those hooks against the plain
/// step without them, from the same state -- a pack/unpack pair gives back what was saved exactly,
/// so any difference is the offload's.
struct OffloadFacts {
  std::string hooks;                 // whose hooks: ckcheck's copy to the CPU, or the factory's offload
  int64_t packed = 0;                // tensors packed in the plain step with the hooks
  int64_t packed_bytes = 0;          // their bytes
  std::vector<std::string> differs;  // tensors of that step (loss, outputs, gradients) that differ
  std::string worst;                 // the one that differs most
  double max_rel = 0.0;              // by this much of its largest magnitude
  std::string error;                 // the step with the hooks threw ("" when it ran)
};

class Model {
 public:
  virtual ~Model() = default;

  virtual std::string name() const = 0;

  /// Every checkpoint site, in the order the forward first reaches it; an outer site comes before
  /// the sites nested in it (blocks.0, blocks.0.attn, blocks.0.ffn, blocks.1, ...).
  virtual std::vector<std::string> sites() const = 0;

  /// The sites checkpoints go to by default: the model's own blocks.
  virtual std::vector<std::string> default_sites() const = 0;

  /// The sites the forward runs through SiteRunner::chain, in order; empty when it has none.
  virtual std::vector<std::string> chain_sites() const { return {}; }

  /// Why a site cannot be checkpointed ("" when it can), e.g. a submodule that takes non-tensor
  /// arguments. Plan::make refuses plans that checkpoint such a site.
  virtual std::string site_problem(const std::string& site) const { return ""; }

  /// The inputs of one step, the same for the same seed.
  virtual std::vector<torch::Tensor> make_inputs(uint64_t seed) = 0;

  /// One forward pass; every site is called through `sites`.
  virtual std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& inputs,
                                             SiteRunner& sites) = 0;

  virtual NamedTensors named_parameters() = 0;
  virtual NamedTensors named_buffers() = 0;

  /// The buffers that belong to a site (its module and the modules inside it).
  virtual std::vector<torch::Tensor> site_buffers(const std::string& site);

  /// Moves parameters, buffers and inputs to a device.
  virtual void to(const torch::Device& device) = 0;
  virtual torch::Device device() const = 0;

  /// The state a step may change besides the parameters: buffers and extra state, live (not
  /// copies).
  virtual NamedTensors state_tensors();

  /// The parameters and state a checkpointed unit of `sites` reads of the model: those of the
  /// modules at these paths and inside them, live, named as named_parameters() and state_tensors()
  /// name them (a module reached through several paths under its first). Read at every
  /// checkpointed call, so that what a call costs does not grow with the model's depth. By default
  /// the whole lists, kept where a name or one of its state_aliases() lies within a site.
  virtual NamedTensors unit_state(const std::vector<std::string>& sites);

  /// The record kind of a state tensor named by state_tensors() (a state_kind:: value).
  virtual std::string state_kind_of(const std::string& name) const;

  /// The other names of a parameter or state tensor that the model reaches through several module
  /// paths (one module every block calls): named_parameters() and state_tensors() list it under its
  /// first path only, and a site reaching it through another path reads it too. Empty for the rest.
  virtual std::vector<std::string> state_aliases(const std::string& name) const { return {}; }

  /// Where the model's code writes state tensor `name` ("FILE:LINE"), where the model can tell (a
  /// module-level variable of a Python model); "" otherwise.
  virtual std::string state_origin(const std::string& name) const { return ""; }

  /// What the last forward() returned, without its values (containers, their keys, the kind of
  /// each leaf), where the model can say; "" otherwise.
  virtual std::string output_structure() const { return ""; }

  /// Module paths whose training flag is off (eval mode), for reports.
  virtual std::vector<std::string> eval_modules() const { return {}; }

  /// Random generators outside torch that a forward may draw from (Python's `random`, NumPy's
  /// global generator, a `random.Random` or NumPy generator a module keeps), each by name with a digest of its state: a unit whose call moves one draws
  /// numbers no checkpoint replays. Empty where the model has none. snapshot() keeps their state.
  virtual std::vector<std::pair<std::string, std::string>> host_generators() const { return {}; }

  /// How many input tensors the arguments of `site`'s latest call held as the model's code got them:
  /// under a checkpoint that hands the recompute the saved tensors, a list the call is handed may
  /// hold others by then (consumed by pop). -1 where the model cannot tell or they hold no list.
  virtual int64_t inputs_seen(const std::string& site) const { return -1; }

  /// What an op-level policy (selective checkpointing) decided at each site in the last checkpointed
  /// forward: how many ops it saved and how many it left to the recompute. Empty without one.
  struct OpPolicyTally {
    std::string site;
    int64_t saved = 0, recomputed = 0;
  };
  virtual std::vector<OpPolicyTally> op_policy() const { return {}; }

  /// The module-level variables of the model's own code (a counter, a loss tracker in a module's
  /// dict), each by name ("FILE:NAME") with a digest of what it holds: a checkpointed call that
  /// changes a digest wrote it. Their values are state_tensors() of kind state_kind::kGlobal, and
  /// snapshot() keeps them. Empty where the model has none (C++ and TorchScript models).
  virtual std::vector<std::pair<std::string, std::string>> module_variables() const { return {}; }

  /// The arguments of the site calls under way that hold state a call may change (a list it
  /// appends to, a cache object whose attributes it rebinds), each by name with a digest of what
  /// it holds; called inside a site call. snapshot() there keeps what they hold. Empty where the
  /// model's calls take tensors only.
  virtual std::vector<std::pair<std::string, std::string>> handed_state() const { return {}; }

  /// A copy of all state, and putting it back. Extra state (extra_state()) is included.
  virtual ModelState snapshot();
  virtual void restore(const ModelState& state);

  /// Analytic activation memory per site for activations of `element_bytes` bytes (4 in fp32, 2
  /// under 16-bit autocast); empty when the model has no formula.
  virtual std::map<std::string, SiteMemory> analytic_memory(int element_bytes) const { return {}; }
  /// Where the formula comes from, for reports.
  virtual std::string analytic_formula() const { return ""; }

  /// The checkpoint under test, applied to each checkpointed unit: ckcheck::checkpoint by
  /// default; a Python model may be checked with torch.utils.checkpoint instead. It must call
  /// `options.observer()` as ckcheck::checkpoint does.
  virtual std::vector<torch::Tensor> checkpoint_unit(const SiteFn& fn, const std::vector<torch::Tensor>& inputs,
                                                     const CheckpointOptions& options) {
    return ckcheck::checkpoint(fn, inputs, options);
  }

  /// Why checkpoint_unit cannot save the ops `ops` names and recompute the others (a sac:OPS
  /// policy), "" when it can: torch.utils.checkpoint's non-reentrant checkpoint with a context_fn,
  /// for Python models trained eagerly.
  virtual std::string selective_problem(const std::vector<std::string>& ops) const {
    return "it applies to a Python model checked under @checkpoint torch or torch-sac, trained eagerly";
  }

  /// What the compiler did with the steps, when the model trains compiled (--compile); nullopt
  /// otherwise. Read after the steps ran.
  virtual std::optional<CompiledSteps> compiled_steps() const { return std::nullopt; }

  /// What the offload's hooks did to the plain step, when the checkpointed step runs offloaded
  /// (--offload); nullopt otherwise.
  virtual std::optional<OffloadFacts> offload_facts() const { return std::nullopt; }

  /// Told when a float64 rerun begins (`dtype`: every floating parameter, state tensor and input
  /// now has it, and it is the default dtype) and when it ends (nullopt). That rerun is ckcheck's
  /// evidence that a difference is rounding; a model computes in it as it can -- a Python model's
  /// ops without a float64 kernel (torch._grouped_mm) by their definition. Nothing by default.
  virtual void precision_changed(std::optional<c10::ScalarType> dtype) {}

  /// Model options as given, for reports and the reproduce command ("layers" -> "4").
  virtual std::map<std::string, std::string> options() const { return {}; }

 protected:
  /// State outside parameters and buffers that a step may change. Names start with '@'.
  virtual NamedTensors extra_state() { return {}; }
  virtual void load_extra_state(const std::string& name, const torch::Tensor& value) {}
};

/// True when `site` is `outer` or nested in it ("blocks.1.attn" is inside "blocks.1").
bool site_within(const std::string& site, const std::string& outer);

}  // namespace ckcheck
