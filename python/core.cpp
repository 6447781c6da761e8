// ckcheck._core: the C++ core of ckcheck inside a Python process, so that eager PyTorch models are
// checked by the same runner, checks and reports as the others.
//
// A Python model (ckcheck/_model.py, class ModelAdapter) is seen by the runner as a Model: every
// call of one of its submodules goes through the runner's SiteRunner, which runs it plainly or
// checkpoints it -- with ckcheck's checkpoint, or with torch.utils.checkpoint (--checkpoint
// torch, torch-reentrant), or leaves the checkpointing to the model's own switch (--checkpoint
// model) and only watches. In every mode the CheckpointObserver hears the forward and the
// recompute of each checkpointed call, so the evidence, causes and sites are those of ckcheck's own
// checkpoint.
//
// The GIL: cli_main releases it for the whole run; every call into Python takes it.
#include <torch/extension.h>

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ckcheck/model.h"
#include "cli/app.h"
#include "cli/common.h"
#include "cli/launch.h"
#include "cli/run.h"
#include "cli/selftest.h"
#include "cli/supervise.h"
#include "cli/validate_op.h"
#include "harness/runner/data_parallel.h"
#include "harness/support/phase.h"
#include "harness/model/random_input.h"
#include "harness/support/errors.h"

namespace py = pybind11;

namespace ckcheck::python {
namespace {

using torch::Tensor;

// "ValueError: bad shape": a Python exception as one line.
std::string one_line(const py::error_already_set& e) {
  std::string type = "Exception";
  try {
    type = py::str(e.type().attr("__name__"));
  } catch (...) {
  }
  std::string message = py::str(e.value());
  const auto cut = message.find('\n');
  // With --verbose the Python side appends the traceback: kept for the error line to show.
  if (cut != std::string::npos && !std::getenv("CKCHECK_VERBOSE")) message = message.substr(0, cut);
  return type == "UsageError" || type == "SetupError" ? message : type + ": " + message;
}

// A message for a Python caller without pybind11's "At:" traceback of ckcheck's own files (kept
// under CKCHECK_VERBOSE).
std::string one_line_of(std::string message) {
  if (std::getenv("CKCHECK_VERBOSE")) return message;
  for (const char* trailer : {"\n\nAt:\n", "\nAt:\n"}) {
    const auto cut = message.find(trailer);
    if (cut != std::string::npos) message = message.substr(0, cut);
  }
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  return message;
}

// The GIL, for a call from the C++ core into Python. An error that autograd left set (its Python
// engine restores a failed backward's Python error before the C++ exception reaches the runner,
// which keeps the message) is stale by then: cleared, or the next call would fail with it.
struct IntoPython {
  py::gil_scoped_acquire gil;
  IntoPython() { PyErr_Clear(); }
};

// Call ids of checkpoints that are not ckcheck's, far from ckcheck::checkpoint's own counter.
int64_t next_call_id() {
  static std::atomic<int64_t> next{int64_t{1} << 40};
  return next++;
}

bool in_backward() {
  return py::module_::import("torch._C").attr("_current_graph_task_id")().cast<int64_t>() != -1;
}

// Reports the gradients reaching `ys` (those that take one) to the observer as they arrive.
void watch_grads(const std::vector<Tensor>& ys, const std::shared_ptr<CheckpointObserver>& observer,
                 const CheckpointCall& call) {
  if (!observer) return;
  for (const auto& y : ys) {
    if (!y.defined() || !y.requires_grad()) continue;
    y.register_hook([observer, call](const Tensor& g) { observer->output_grads(call, {g}); });
  }
}

// Runs one call of a unit, told to the observer as the forward or as the recompute.
// The observer's own ops (copies of the outputs, the comparison of a recompute with its forward)
// run past every Python dispatch mode the model's step has on: the user's program never sees them.
// Selective checkpointing's mode counts the ops of a recompute against those of its forward, and
// would take the comparison for ops the forward never ran.
class OutsideDispatchModes {
 public:
  OutsideDispatchModes()
      : python_(c10::DispatchKeySet(c10::DispatchKey::Python)),
        snapshot_(c10::DispatchKeySet(c10::DispatchKey::PythonTLSSnapshot)) {}

 private:
  c10::impl::ExcludeDispatchKeyGuard python_, snapshot_;
};

std::vector<Tensor> observed_call(const SiteFn& fn, const std::vector<Tensor>& xs,
                                  const std::shared_ptr<CheckpointObserver>& observer, const CheckpointCall& call,
                                  bool recompute) {
  if (observer) {
    OutsideDispatchModes outside;
    recompute ? observer->recompute_begin(call, xs, {}) : observer->forward_begin(call, xs);
  }
  auto ys = fn(xs);
  if (observer) {
    OutsideDispatchModes outside;
    recompute ? observer->recompute_end(call, ys) : observer->forward_end(call, xs, ys);
  }
  return ys;
}

// The process group of a Python model's data-parallel engine (torch.distributed, joined by the
// adapter), as the runner's Collective: its store carries what each rank saw to rank 0.
class PythonCollective : public Collective {
 public:
  explicit PythonCollective(py::object group) : group_(std::move(group)) {
    IntoPython gil;
    rank_ = group_.attr("rank").cast<int>();
    world_ = group_.attr("world_size").cast<int>();
    backend_ = group_.attr("backend").cast<std::string>();
  }
  ~PythonCollective() override {
    IntoPython gil;
    group_ = py::object();
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return backend_; }
  void allreduce_sum(std::vector<Tensor>& tensors) override {
    IntoPython gil;
    group_.attr("allreduce_sum")(tensors);
  }
  void set(const std::string& key, const std::string& value) override {
    IntoPython gil;
    group_.attr("set")(key, py::bytes(value));
  }
  std::string get(const std::string& key) override {
    IntoPython gil;
    return group_.attr("get")(key).cast<std::string>();
  }
  void barrier() override {
    IntoPython gil;
    group_.attr("barrier")();
  }

 private:
  py::object group_;
  int rank_ = 0, world_ = 1;
  std::string backend_;
};

class PythonModel : public Model, public ParallelEngine {
 public:
  PythonModel(py::object adapter, CheckpointKind checkpoint) : adapter_(std::move(adapter)), checkpoint_(checkpoint) {
    name_ = adapter_.attr("name").cast<std::string>();
    sites_ = adapter_.attr("sites").cast<std::vector<std::string>>();
    default_sites_ = adapter_.attr("default_sites").cast<std::vector<std::string>>();
    compiled_ = adapter_.attr("compiled").cast<bool>();
  }
  ~PythonModel() override {
    IntoPython gil;
    snapshots_.clear();
    try {
      adapter_.attr("close")();  // the user's modules get their own forwards back
    } catch (py::error_already_set&) {
    }
    adapter_ = py::object();
  }

  std::string name() const override { return name_; }
  std::vector<std::string> sites() const override { return sites_; }
  std::vector<std::string> default_sites() const override { return default_sites_; }

  std::string site_problem(const std::string& site) const override {
    IntoPython gil;
    return adapter_.attr("site_problem")(site).cast<std::string>();
  }

  std::vector<Tensor> make_inputs(uint64_t seed) override {
    IntoPython gil;
    return call<std::vector<Tensor>>("make_inputs", seed);
  }

  // The module calls go to `runner` until the next forward: a recompute during this step's
  // backward calls them again (the runner lives until the step's backward is over).
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, SiteRunner& runner) override {
    IntoPython gil;
    pending_.clear();
    tapped_calls_.clear();
    auto call_site = py::cpp_function([&runner](const std::string& site, py::function fn, std::vector<Tensor> xs) {
      // The checkpoint may keep the function until a backward that runs without the GIL.
      std::shared_ptr<py::function> held(new py::function(std::move(fn)), [](py::function* p) {
        py::gil_scoped_acquire gil;
        delete p;
      });
      SiteFn f = [held](const std::vector<Tensor>& ts) {
        IntoPython gil;
        return (*held)(ts).cast<std::vector<Tensor>>();
      };
      return runner.call(site, f, xs);
    });
    const auto budget = runner.compiler_budget();
    try {
      return call<std::vector<Tensor>>("forward", inputs, call_site, runner.checkpointing(),
                                       runner.checkpointed_sites(), budget ? py::cast(*budget) : py::none(),
                                       runner.sac_save());
    } catch (py::error_already_set& e) {
      // What the factory handed over, failing as the step runs (its loss raised): bad input.
      if (e.matches(py::module_::import("ckcheck._model").attr("SetupError"))) throw SetupError(one_line(e));
      throw;
    }
  }

  std::optional<CompiledSteps> compiled_steps() const override {
    IntoPython gil;
    const py::object facts = adapter_.attr("compiled_facts")();
    if (facts.is_none()) return std::nullopt;
    const auto d = facts.cast<py::dict>();
    CompiledSteps c;
    c.mode = d["mode"].cast<std::string>();
    c.memory_budget = d["memory_budget"].cast<double>();
    c.whole_graph = d["whole_graph"].cast<bool>();
    c.compile_seconds = d["compile_seconds"].cast<double>();
    c.plain_graphs = d["plain_graphs"].cast<int64_t>();
    c.checkpointed_graphs = d["checkpointed_graphs"].cast<int64_t>();
    c.graph_breaks = d["graph_breaks"].cast<std::vector<std::string>>();
    c.plain_saved = d["plain_saved"].cast<int64_t>();
    c.checkpointed_saved = d["checkpointed_saved"].cast<int64_t>();
    c.plain_saved_bytes = d["plain_saved_bytes"].cast<int64_t>();
    c.last_saved_bytes = d["last_saved_bytes"].cast<int64_t>();
    c.plain_backward_random = d["plain_backward_random"].cast<int64_t>();
    c.replayed_random = d["replayed_random"].cast<int64_t>();
    for (const auto& item : d["recomputed_random"]) {
      const auto t = item.cast<py::tuple>();
      c.recomputed_random.push_back({t[0].cast<std::string>(), t[1].cast<std::string>(), t[2].cast<std::string>()});
    }
    c.eager_compared = d["eager_compared"].cast<bool>();
    c.eager_note = d["eager_note"].cast<std::string>();
    c.eager_max_rel = d["eager_max_rel"].cast<double>();
    c.eager_worst = d["eager_worst"].cast<std::string>();
    c.eager_tolerance = d["eager_tolerance"].cast<double>();
    return c;
  }

  std::optional<OffloadFacts> offload_facts() const override {
    IntoPython gil;
    const py::object facts = adapter_.attr("offload_facts")();
    if (facts.is_none()) return std::nullopt;
    const auto d = facts.cast<py::dict>();
    OffloadFacts o;
    o.hooks = d["hooks"].cast<std::string>();
    o.packed = d["packed"].cast<int64_t>();
    o.packed_bytes = d["packed_bytes"].cast<int64_t>();
    o.differs = d["differs"].cast<std::vector<std::string>>();
    o.worst = d["worst"].cast<std::string>();
    o.max_rel = d["max_rel"].cast<double>();
    o.error = d["error"].cast<std::string>();
    return o;
  }

  // (name, tensor or None, kind) triples from the adapter; a parameter's kind is "" and not kept.
  NamedTensors named_state(const py::handle& items) {
    NamedTensors out;
    for (const auto& item : items) {
      auto t = item.cast<py::tuple>();
      const auto name = t[0].cast<std::string>();
      auto kind = t[2].cast<std::string>();
      if (!kind.empty()) kinds_[name] = std::move(kind);
      out.emplace_back(name, t[1].is_none() ? Tensor() : t[1].cast<Tensor>());
    }
    return out;
  }

  NamedTensors named_parameters() override { return named("named_parameters"); }
  NamedTensors named_buffers() override { return named("named_buffers"); }

  NamedTensors state_tensors() override {
    IntoPython gil;
    return named_state(adapter_.attr("state_tensors")());
  }

  NamedTensors unit_state(const std::vector<std::string>& sites) override {
    {
      IntoPython gil;
      const py::object items = adapter_.attr("unit_state")(sites);
      if (!items.is_none()) return named_state(items);
    }
    return Model::unit_state(sites);  // a site that is no module path: the whole lists, filtered
  }

  std::string state_kind_of(const std::string& name) const override {
    auto it = kinds_.find(name);
    return it != kinds_.end() ? it->second : Model::state_kind_of(name);
  }

  std::vector<std::string> state_aliases(const std::string& name) const override {
    if (!aliases_) {
      IntoPython gil;
      aliases_ = adapter_.attr("state_aliases")().cast<std::map<std::string, std::vector<std::string>>>();
    }
    auto it = aliases_->find(name);
    return it != aliases_->end() ? it->second : std::vector<std::string>{};
  }

  int64_t inputs_seen(const std::string& site) const override {
    IntoPython gil;
    return adapter_.attr("inputs_seen")(site).cast<int64_t>();
  }

  std::vector<OpPolicyTally> op_policy() const override {
    IntoPython gil;
    std::vector<OpPolicyTally> out;
    for (const auto& [site, saved, recomputed] :
         adapter_.attr("op_policy")().cast<std::vector<std::tuple<std::string, int64_t, int64_t>>>()) {
      out.push_back({site, saved, recomputed});
    }
    return out;
  }

  std::vector<std::pair<std::string, std::string>> module_variables() const override {
    IntoPython gil;
    return adapter_.attr("module_variables")().cast<std::vector<std::pair<std::string, std::string>>>();
  }

  std::string state_origin(const std::string& name) const override {
    IntoPython gil;
    return adapter_.attr("state_origin")(name).cast<std::string>();
  }

  std::string output_structure() const override {
    IntoPython gil;
    return adapter_.attr("last_structure").cast<std::string>();
  }

  std::vector<std::pair<std::string, std::string>> host_generators() const override {
    IntoPython gil;
    return adapter_.attr("host_generators")().cast<std::vector<std::pair<std::string, std::string>>>();
  }

  std::vector<std::pair<std::string, std::string>> handed_state() const override {
    IntoPython gil;
    return adapter_.attr("handed_state")().cast<std::vector<std::pair<std::string, std::string>>>();
  }

  std::vector<std::string> eval_modules() const override {
    IntoPython gil;
    return adapter_.attr("eval_modules")().cast<std::vector<std::string>>();
  }

  void to(const torch::Device& device) override {
    IntoPython gil;
    adapter_.attr("to")(device.str());
    device_ = device;
  }
  torch::Device device() const override { return device_; }

  // The Python side copies and puts back everything (parameters, buffers, attributes, training
  // flags); the ModelState carries the key of its copy.
  ModelState snapshot() override {
    IntoPython gil;
    const int64_t key = next_snapshot_++;
    snapshots_[key] = adapter_.attr("snapshot")();
    ModelState s;
    s.values.emplace_back("@python-snapshot", c10::IValue(key));
    return s;
  }

  void restore(const ModelState& state) override {
    IntoPython gil;
    for (const auto& [name, value] : state.values) {
      if (name != "@python-snapshot") continue;
      auto it = snapshots_.find(value.toInt());
      TORCH_CHECK(it != snapshots_.end(), "model ", name_, ": unknown snapshot");
      adapter_.attr("restore")(it->second);
    }
  }

  void precision_changed(std::optional<c10::ScalarType> dtype) override {
    IntoPython gil;
    adapter_.attr("precision_changed")(dtype.has_value());
  }

  std::map<std::string, std::string> options() const override {
    IntoPython gil;
    return adapter_.attr("options")().cast<std::map<std::string, std::string>>();
  }

  std::string selective_problem(const std::vector<std::string>& ops) const override {
    if ((checkpoint_ != CheckpointKind::kTorch && checkpoint_ != CheckpointKind::kTorchSac) || compiled_) {
      return Model::selective_problem(ops);
    }
    IntoPython gil;
    return adapter_.attr("selective_problem")(ops).cast<std::string>();
  }

  // --parallel: the adapter wraps the module in PyTorch's engine and joined its process group.
  ParallelKind engine() const override {
    IntoPython gil;
    return adapter_.attr("parallel").cast<ParallelKind>();
  }
  std::unique_ptr<Collective> engine_collective() override {
    IntoPython gil;
    return std::make_unique<PythonCollective>(adapter_.attr("process_group"));
  }
  void use_engine(bool on) override {
    IntoPython gil;
    adapter_.attr("use_engine")(on);
  }
  void engine_step_done() override {
    IntoPython gil;
    adapter_.attr("engine_step_done")();
  }
  std::string engine_mixed_precision() const override {
    IntoPython gil;
    return adapter_.attr("mixed_precision").cast<std::string>();
  }
  std::vector<std::string> engine_op_scopes() const override {
    IntoPython gil;
    return adapter_.attr("engine_op_scopes").cast<std::vector<std::string>>();
  }
  std::optional<std::vector<int64_t>> engine_hook_fires() override {
    IntoPython gil;
    const py::object fires = adapter_.attr("engine_hook_fires")();
    if (fires.is_none()) return std::nullopt;
    return fires.cast<std::vector<int64_t>>();
  }

  std::vector<Tensor> checkpoint_unit(const SiteFn& fn, const std::vector<Tensor>& inputs,
                                      const CheckpointOptions& o) override {
    if (checkpoint_ == CheckpointKind::kCkcheck) return ckcheck::checkpoint(fn, inputs, o);
    IntoPython gil;
    if (checkpoint_ == CheckpointKind::kModel) return watch_own(fn, inputs, o);
    return torch_checkpoint(fn, inputs, o);
  }

 private:
  template <typename T, typename... Args>
  T call(const char* method, Args&&... args) {
    return adapter_.attr(method)(std::forward<Args>(args)...).template cast<T>();
  }

  NamedTensors named(const char* method) {
    IntoPython gil;
    NamedTensors out;
    for (const auto& item : adapter_.attr(method)()) {
      auto t = item.cast<py::tuple>();
      out.emplace_back(t[0].cast<std::string>(), t[1].cast<Tensor>());
    }
    return out;
  }

  // torch.utils.checkpoint around the unit; the function it calls tells the observer whether it
  // runs as the forward (first call) or the recompute (later calls).
  std::vector<Tensor> torch_checkpoint(const SiteFn& fn, const std::vector<Tensor>& inputs,
                                       const CheckpointOptions& o) {
    const CheckpointCall call{o.name(), next_call_id()};
    auto observer = o.observer();
    auto calls = std::make_shared<int>(0);
    auto inner = py::cpp_function([fn, observer, call, calls](py::args args) {
      std::vector<Tensor> xs;
      for (const auto& a : args) xs.push_back(a.cast<Tensor>());
      return py::tuple(py::cast(observed_call(fn, xs, observer, call, (*calls)++ > 0)));
    });
    auto ys = adapter_.attr("torch_checkpoint")(inner, inputs, checkpoint_ == CheckpointKind::kTorchReentrant, o.preserve_rng_state())
                  .cast<std::vector<Tensor>>();
    watch_grads(ys, observer, call);
    return ys;
  }

  // --checkpoint model: the model checkpoints itself. Through the checkpoint tap the adapter says
  // which checkpoint call runs the unit and whether as its forward or its recompute (a checkpoint
  // inside a recomputed unit starts a new call). A unit the tap does not see: its call in the
  // forward is the forward, its call during backward the recompute of its latest call.
  std::vector<Tensor> watch_own(const SiteFn& fn, const std::vector<Tensor>& inputs, const CheckpointOptions& o) {
    auto observer = o.observer();
    bool recompute = false;
    CheckpointCall call;
    const py::object tapped = adapter_.attr("unit_call");
    if (!tapped.is_none()) {
      const auto [serial, again] = tapped.cast<std::pair<int64_t, bool>>();
      auto it = tapped_calls_.find(serial);
      // A call run again whose forward ran plainly (inside another unit): nothing to pair it with.
      if (again && it == tapped_calls_.end()) return fn(inputs);
      recompute = again;
      if (recompute) {
        call = it->second;
      } else {
        call = CheckpointCall{o.name(), next_call_id()};
        tapped_calls_[serial] = call;
      }
    } else {
      auto& stack = pending_[o.name()];
      recompute = in_backward() && !stack.empty();
      call = recompute ? stack.back() : CheckpointCall{o.name(), next_call_id()};
      if (recompute) stack.pop_back();
      if (!recompute) stack.push_back(call);
    }
    auto ys = observed_call(fn, inputs, observer, call, recompute);
    watch_grads(ys, observer, call);
    return ys;
  }

  py::object adapter_;
  CheckpointKind checkpoint_;
  bool compiled_ = false;
  std::string name_;
  std::vector<std::string> sites_, default_sites_;
  std::map<std::string, std::string> kinds_;
  mutable std::optional<std::map<std::string, std::vector<std::string>>> aliases_;  // read once
  torch::Device device_ = torch::kCPU;
  std::map<int64_t, py::object> snapshots_;
  int64_t next_snapshot_ = 1;
  std::map<std::string, std::vector<CheckpointCall>> pending_;  // --checkpoint model, untapped units
  std::map<int64_t, CheckpointCall> tapped_calls_;              // --checkpoint model, by tap serial
};

// The model handed to ckcheck._core.run on this thread, with the name the report gives it; null
// when the model comes from a --model spec.
struct GivenModel {
  py::object factory;
  std::string name;
};
thread_local const GivenModel* given_model = nullptr;

std::unique_ptr<Model> load(const cli::ModelArgs& args, cli::CheckpointChoice& choice) {
  // --input-shape/--input-dtype/--input-range are parsed and the tensor made here, once, by the
  // rules the TorchScript models use; the factory's module gets the tensor.
  const auto random = RandomInput::parse(args.input_shape, args.input_dtype, args.input_range);
  py::gil_scoped_acquire gil;
  try {
    py::dict inputs;
    inputs["tensor"] = random.given() ? py::cast(random.make(args.seed)) : py::none();
    inputs["file"] = args.input_file;
    py::object compile = py::none();
    if (args.compile) {
      py::dict c;
      c["mode"] = args.compile_mode;
      c["memory_budget"] = args.memory_budget;
      c["input_requires_grad"] = args.input_requires_grad;
      compile = c;
    }
    py::dict policy;  // --sac-save, --offload
    policy["sac_save"] = args.sac_save;
    policy["offload"] = args.offload;
    policy["parallel"] = args.parallel;
    policy["parallel_timeout"] = args.parallel_timeout;
    policy["mixed_precision"] = args.mixed_precision;
    const py::object spec = given_model ? given_model->factory : py::cast(args.model);
    auto adapter = py::module_::import("ckcheck._model")
                       .attr("load")(spec, args.seed, inputs, args.checkpoint, args.mode, compile, policy);
    if (given_model) adapter.attr("name") = given_model->name;
    choice = {adapter.attr("checkpoint").cast<CheckpointKind>(), adapter.attr("checkpoint_reason").cast<std::string>()};
    return std::make_unique<PythonModel>(adapter, choice.kind);
  } catch (py::error_already_set& e) {
    // A SIGINT while the factory runs (its imports, its weights) stops the run as it would later.
    if (e.matches(PyExc_KeyboardInterrupt)) throw Interrupted();
    if (given_model) throw UsageError(fmt::format("model {}: {}", given_model->name, one_line(e)));
    throw UsageError(fmt::format("--model {}: {}", args.model, one_line(e)));
  }
}

// How the core reaches this Python process: its models, the modules that register custom ops, and
// its output buffers before a report is written. Set once, when the module is imported.
void install_hooks() {
  cli::set_python_model_loader(load);
  // The ranks of a data-parallel run are this Python running ckcheck's CLI again.
  {
    py::gil_scoped_acquire gil;
    cli::set_rank_program({py::module_::import("sys").attr("executable").cast<std::string>(), "-m", "ckcheck"});
  }
  cli::set_python_importer([](const std::string& module) {
    py::gil_scoped_acquire gil;
    try {
      py::module_::import("ckcheck._model").attr("import_ops")(module);
    } catch (py::error_already_set& e) {
      throw UsageError(one_line(e));  // the helper's message names --import and the module
    }
  });
  // What the model printed through Python's buffers goes out before a report takes stdout back.
  cli::set_before_report([] {
    py::gil_scoped_acquire gil;
    try {
      py::module_::import("sys").attr("stdout").attr("flush")();
      py::module_::import("sys").attr("stderr").attr("flush")();
    } catch (py::error_already_set&) {
    }
  });
}

int cli_main(const std::vector<std::string>& args) {
  py::gil_scoped_release released;
  return cli::run_cli(args);
}

// ---------------------------------------------------------------------------------------------
// The typed binding: options by keyword (each option-table row's keyword(), the checks' knobs with
// '_' for '-'), values of their own types, the report returned -- no command line, no file, no
// redirected output.

std::string type_name(py::handle value) { return py::str(py::type::of(value).attr("__name__")); }

// A Python value as the type of the field it sets; FieldError names the keyword otherwise.
template <class T>
T typed(const std::string& key, py::handle value) {
  auto wrong = [&](const char* expected) {
    return FieldError(key, fmt::format("@{} takes {}, not {} {}", key, expected, type_name(value),
                                       py::repr(value).cast<std::string>()));
  };
  const bool is_bool = PyBool_Check(value.ptr());
  if constexpr (std::is_same_v<T, bool>) {
    if (!is_bool) throw wrong("True or False");
    return value.cast<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!py::isinstance<py::str>(value)) throw wrong("a string");
    return value.cast<std::string>();
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    if (py::isinstance<py::str>(value)) return cli::split_list({value.cast<std::string>()});
    if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value)) throw wrong("a string or a list of strings");
    std::vector<std::string> out;
    for (const auto& item : value) {
      if (!py::isinstance<py::str>(item)) throw wrong("a string or a list of strings");
      out.push_back(item.cast<std::string>());
    }
    return cli::split_list(out);
  } else if constexpr (std::is_integral_v<T>) {
    if (is_bool || !PyLong_Check(value.ptr())) throw wrong("a whole number");
    try {
      return value.cast<T>();
    } catch (const py::cast_error&) {
      PyErr_Clear();
      throw FieldError(key, fmt::format("@{} {} is out of range", key, py::repr(value).cast<std::string>()));
    }
  } else {
    if (is_bool || !(PyLong_Check(value.ptr()) || PyFloat_Check(value.ptr()))) throw wrong("a number");
    return value.cast<T>();
  }
}

// A value as the command line would have written it, for the row's check.
template <class T>
std::vector<std::string> texts_of(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return {v};
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return v;  // checked item by item, as the command line's comma-separated list
  } else if constexpr (std::is_same_v<T, bool>) {
    return {};
  } else {
    return {fmt::format("{}", v)};
  }
}

// Sets the option `key` names in `table`'s rows; false when no row has that keyword.
template <class Options>
bool set_option(const cli::OptionTable<Options>& table, Options& o, const std::string& key, py::handle value) {
  const auto* row = cli::row_of_keyword(table, key);
  if (!row) return false;
  row->visit_field(o, [&](auto& field) {
    using T = std::decay_t<decltype(field)>;
    T v = typed<T>(key, value);
    for (const auto& text : texts_of(v)) {
      const auto problem = row->check_text(text);
      if (!problem.empty()) throw FieldError(key, fmt::format("@{} {}: {}", key, py::repr(value).cast<std::string>(), problem));
    }
    field = std::move(v);
  });
  return true;
}

// A check's knob, by its name with '_' for '-'; false when there is none.
bool set_knob(cli::RunOptions& o, const std::string& key, py::handle value) {
  std::string name = key;
  std::replace(name.begin(), name.end(), '_', '-');
  if (!o.knobs.count(name)) return false;
  const auto& knob = find_knob(name);
  const double v = typed<double>(key, value);
  auto text = fmt::format("{}", v);
  const auto problem = cli::finite_number(knob.min, knob.max, knob.min_open)(text);
  if (!problem.empty()) throw FieldError(key, fmt::format("@{} {}: {}", key, text, problem));
  o.knobs[name] = v;
  return true;
}

template <class Options>
void add_keywords(const cli::OptionTable<Options>& table, std::vector<std::string>& out) {
  for (const auto& row : table) out.push_back(row.keyword());
}

[[noreturn]] void unknown_option(const std::string& function, const std::string& key, std::vector<std::string> known) {
  std::sort(known.begin(), known.end());
  throw UsageError(fmt::format("{}() has no option '{}'; options: {}", function, key, fmt::join(known, ", ")));
}

// A field a library error names, as the keyword that sets it.
std::string keyword_of_field(const std::string& field) { return cli::keyword_of_flag(cli::flag_for_field(field)); }

[[noreturn]] void raise_usage_error(const std::string& message, const std::string& field) {
  py::object cls = py::module_::import("ckcheck._model").attr("UsageError");
  py::object error = cls(one_line_of(message));
  error.attr("field") = field.empty() ? py::none() : py::cast(field);
  PyErr_SetObject(cls.ptr(), error.ptr());
  throw py::error_already_set();
}

// Runs `work` (with the GIL; it releases it for the run); its C++ errors reach Python as
// ckcheck.UsageError (a FieldError's keyword in .field), a Python error as itself.
template <class F>
auto python_errors(F&& work) -> decltype(work()) {
  try {
    return work();
  } catch (py::error_already_set&) {
    throw;
  } catch (const Interrupted&) {
    // Ctrl-C reached the model's Python code: the caller gets its KeyboardInterrupt, at once.
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  } catch (const FieldError& e) {
    raise_usage_error(e.render(keyword_of_field), keyword_of_field(e.field()));
  } catch (const c10::Error& e) {
    raise_usage_error(e.what_without_backtrace(), "");
  } catch (const std::exception& e) {
    raise_usage_error(e.what(), "");
  }
}

// A JSON value as the Python object json.loads would give for its text (a non-finite number, which
// JSON text writes as null, as None); strings decoded as UTF-8, an invalid byte replaced.
py::object to_python(const nlohmann::json& j) {
  using Type = nlohmann::json::value_t;
  switch (j.type()) {
    case Type::object: {
      py::dict d;
      for (const auto& [key, value] : j.items()) d[to_python(key)] = to_python(value);
      return std::move(d);
    }
    case Type::array: {
      py::list l;
      for (const auto& value : j) l.append(to_python(value));
      return std::move(l);
    }
    case Type::string: {
      const auto& s = j.get_ref<const std::string&>();
      return py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
    }
    case Type::boolean:
      return py::bool_(j.get<bool>());
    case Type::number_integer:
      return py::int_(j.get<int64_t>());
    case Type::number_unsigned:
      return py::int_(j.get<uint64_t>());
    case Type::number_float:
      return std::isfinite(j.get<double>()) ? py::object(py::float_(j.get<double>())) : py::none();
    default:
      return py::none();
  }
}

// (the report as Python objects: ckcheck.Report's data, converted once here; the console report's
// text)
py::tuple report_texts(const Report& report) {
  std::ostringstream console;
  make_console_reporter(false)->write(report, console);
  return py::make_tuple(to_python(report_json(report)), console.str());
}

// `ckcheck run`'s options a call gives by keyword, for the model `factory` (named `name`); `extra`
// takes the calling function's own keywords (`extra_known` lists them for the error).
cli::RunOptions keyword_options(const py::object& factory, const std::string& name, const py::dict& options,
                                const char* function,
                                const std::function<bool(const std::string&, py::handle)>& extra = nullptr,
                                const std::vector<std::string>& extra_known = {}) {
  auto o = cli::default_run_options();
  // A factory's name is the --model it was given as (and the reproduce line's); a factory object
  // goes to the loader, under its name when that is one --model takes.
  const bool named = py::isinstance<py::str>(factory);
  o.model.model = named || cli::is_python_model(name) ? name : "ckcheck.run:model";
  std::vector<std::string> known = extra_known;
  add_keywords(cli::model_option_table(), known);
  add_keywords(cli::run_option_table(), known);
  for (const auto& [knob, value] : o.knobs) known.push_back(knob);
  known.erase(std::remove(known.begin(), known.end(), std::string("model")), known.end());  // the factory
  for (auto& k : known) std::replace(k.begin(), k.end(), '-', '_');
  for (const auto& [k, value] : options) {
    const auto key = k.cast<std::string>();
    const bool set = key != "model" && ((extra && extra(key, value)) ||
                                        set_option(cli::model_option_table(), o.model, key, value) ||
                                        set_option(cli::run_option_table(), o, key, value) || set_knob(o, key, value));
    if (!set) unknown_option(function, key, known);
  }
  return o;
}

// Runs `work` with the factory object handed to the loader (a named factory the loader imports).
template <class F>
Report with_given_model(py::object factory, const std::string& name, F&& work) {
  const bool named = py::isinstance<py::str>(factory);
  const GivenModel given{std::move(factory), name};
  if (!named) given_model = &given;
  struct Reset {
    ~Reset() { given_model = nullptr; }
  } reset;
  py::gil_scoped_release released;
  return work();
}

py::tuple run_options(py::object factory, const std::string& name, const py::dict& options) {
  const auto o = keyword_options(factory, name, options, "run");
  return report_texts(with_given_model(std::move(factory), name, [&] { return cli::run_in_process(o); }));
}

py::tuple selftest_options(py::object factory, const std::string& name, const py::dict& options) {
  cli::SelftestOptions s;
  auto extra = [&s](const std::string& key, py::handle value) {
    if (key == "plants") {
      s.plants = typed<std::vector<std::string>>(key, value);
      return true;
    }
    if (key == "every_site") {
      s.every_site = typed<bool>(key, value);
      return true;
    }
    return false;
  };
  s.run = keyword_options(factory, name, options, "selftest", extra, {"plants", "every_site"});
  return report_texts(with_given_model(std::move(factory), name, [&] { return cli::selftest_in_process(s); }));
}

py::tuple validate_op_options(const py::dict& options) {
  cli::ValidateOpOptions o;
  std::vector<std::string> known;
  add_keywords(cli::validate_op_option_table(), known);
  for (const auto& [k, value] : options) {
    const auto key = k.cast<std::string>();
    if (!set_option(cli::validate_op_option_table(), o, key, value)) unknown_option("validate_op", key, known);
  }
  std::optional<Report> report;
  {
    py::gil_scoped_release released;
    report = cli::validate_op_report(o);
  }
  return report_texts(*report);
}

py::tuple run(py::object factory, const std::string& name, const py::dict& options) {
  return python_errors([&] { return run_options(std::move(factory), name, options); });
}

py::tuple validate_op(const py::dict& options) {
  return python_errors([&] { return validate_op_options(options); });
}

py::tuple selftest(py::object factory, const std::string& name, const py::dict& options) {
  return python_errors([&] { return selftest_options(std::move(factory), name, options); });
}

// An enum of one of ckcheck's vocabularies as a Python enum: its values by name, each with .text,
// its word (`what` says where the word is written).
template <class E>
py::enum_<E> bind_words(py::module_& m, const char* name, const char* doc, const char* (*word)(E), const char* what,
                        std::initializer_list<std::pair<const char*, E>> values) {
  py::enum_<E> e(m, name, doc);
  for (const auto& [value_name, value] : values) e.value(value_name, value);
  e.def_property_readonly("text", [word](E v) { return std::string(word(v)); }, what);
  return e;
}

// ... with .parse(word), the value a word gives (ValueError for another): an option's kinds.
template <class E>
void bind_kind(py::module_& m, const char* name, const char* doc, const char* (*word)(E), E (*parse)(const std::string&),
               const char* what, std::initializer_list<std::pair<const char*, E>> values) {
  bind_words<E>(m, name, doc, word, what, values).def_static("parse", [parse](const std::string& text) {
    try {
      return parse(text);
    } catch (const UsageError& e) {
      throw py::value_error(e.what());
    }
  }, py::arg("name"), "The kind a name gives (ValueError for another).");
}

// ckcheck's vocabularies, one for C++ and Python: the checkpoint under test
// (harness/support/checkpoint_kind.h), the data-parallel engine (harness/runner/data_parallel.h), a
// command's verdict and a check's status (checks/check.h; ckcheck.Verdict and ckcheck.Status are
// made from them) and the causes (ckcheck.Cause).
void bind_vocabularies(py::module_& m) {
  bind_kind<CheckpointKind>(m, "CheckpointKind", "The checkpoint under test (--checkpoint), as a kind.",
                            checkpoint_kind_name, parse_checkpoint_kind, "Its name, as --checkpoint spells it.",
                            {{"auto", CheckpointKind::kAuto}, {"ckcheck", CheckpointKind::kCkcheck},
                             {"torch", CheckpointKind::kTorch}, {"torch_reentrant", CheckpointKind::kTorchReentrant},
                             {"torch_sac", CheckpointKind::kTorchSac}, {"torch_wrapper", CheckpointKind::kTorchWrapper},
                             {"model", CheckpointKind::kModel}, {"compiler", CheckpointKind::kCompiler}});
  bind_kind<ParallelKind>(m, "ParallelKind", "The data-parallel engine (--parallel), as a kind.", parallel_kind_name,
                          parse_parallel_kind, "Its name, as --parallel spells it.",
                          {{"off", ParallelKind::kOff}, {"ddp", ParallelKind::kDdp}, {"fsdp", ParallelKind::kFsdp}});
  bind_words<Verdict>(m, "Verdict", "A command's verdict.", verdict_name, "Its word in reports (pass).",
                      {{"PASS", Verdict::kPass}, {"FAIL", Verdict::kFail}, {"ERROR", Verdict::kError}});
  bind_words<Status>(m, "Status", "A check's status.", status_name, "Its word in reports (warn).",
                     {{"PASS", Status::kPass}, {"WARN", Status::kWarn}, {"FAIL", Status::kFail},
                      {"SKIP", Status::kSkip}, {"ERROR", Status::kError}});
  m.def("cause_names", [] {
    std::vector<std::string> names;
    for (const auto& c : all_causes()) names.emplace_back(c.name());
    return names;
  }, "The cause vocabulary's words, as `ckcheck list` names them (ckcheck.Cause is made from them).");
}

}  // namespace
}  // namespace ckcheck::python

PYBIND11_MODULE(_core, m) {
  m.doc() = "ckcheck's C++ core: the runner, checks and reports, for eager PyTorch models";
  ckcheck::python::install_hooks();
  ckcheck::python::bind_vocabularies(m);
  m.def("set_status_fd", &ckcheck::set_status_fd, py::arg("fd"),
        "Tells a supervising ckcheck program, through this file descriptor, the phase of the run.");
  m.def("cli_main", &ckcheck::python::cli_main, py::arg("argv"),
        "Runs `ckcheck ARGV...` in this process (Python models allowed); returns the exit status.");
  m.def("run", &ckcheck::python::run, py::arg("factory"), py::arg("name"), py::arg("options"),
        "Checks the model a factory makes -- a callable (the report names it `name`) or its --model name -- "
        "with `ckcheck run`'s options by keyword "
        "(input_requires_grad=True, accumulate=2, ...); returns (the report as a dict, console text). Raises "
        "ckcheck.UsageError (.field: the keyword) for what cannot be checked.");
  m.def("selftest", &ckcheck::python::selftest, py::arg("factory"), py::arg("name"), py::arg("options"),
        "Plants each class of bug into the model a factory makes and checks it, as `ckcheck selftest` does, "
        "with `ckcheck run`'s options and plants=, every_site= by keyword; returns (the report as a dict, console text). Raises ckcheck.UsageError for what cannot be checked.");
  m.def("validate_op", &ckcheck::python::validate_op, py::arg("options"),
        "Validates a custom op with `ckcheck validate-op`'s options by keyword (op=, shapes=, ...); returns "
        "(the report as a dict, console text).");
}
