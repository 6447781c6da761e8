#include "cli/common.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <set>
#include <thread>
#include <sys/stat.h>

#include "fixtures/registry.h"
#include "harness/model/torchscript_model.h"
#include "cli/supervise.h"
#include "harness/support/errors.h"
#include "harness/support/phase.h"
#include "harness/support/text.h"

namespace ckcheck::cli {

std::map<std::string, std::string> ModelArgs::given_options() const {
  std::map<std::string, std::string> out;
  for (const auto& [name, opt] : option_flags) {
    if (opt->count() > 0) out[name] = raw_options.at(name);
  }
  return out;
}

namespace {

// The options of all built-in models, each shown once with the models that take it.
void add_builtin_model_options(CLI::App& app, ModelArgs& args) {
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> by_option;
  std::vector<std::string> order;
  for (const auto& spec : builtin_models()) {
    for (const auto& o : spec.options) {
      if (!by_option.count(o.name)) order.push_back(o.name);
      by_option[o.name].push_back({spec.name, fmt::format("{} (default {})", o.help, o.default_value)});
    }
  }
  auto* group = app.add_option_group("Model options", "options of the built-in models (see `ckcheck list`)");
  for (const auto& name : order) {
    std::map<std::string, std::vector<std::string>> models_by_help;
    size_t faulty = 0;
    for (const auto& [model, help] : by_option[name]) faulty += model.rfind("faulty/", 0) == 0;
    for (const auto& [model, help] : by_option[name]) {
      // faulty/* share the mlp options; name them once when several do.
      const auto shown = model.rfind("faulty/", 0) == 0 && faulty > 1 ? std::string("faulty/*") : model;
      auto& v = models_by_help[help];
      if (std::find(v.begin(), v.end(), shown) == v.end()) v.push_back(shown);
    }
    std::vector<std::string> parts;
    for (const auto& [help, models] : models_by_help) parts.push_back(fmt::format("{}: {}", fmt::join(models, ", "), help));
    auto* opt = group->add_option("--" + name, args.raw_options[name], fmt::format("{}", fmt::join(parts, "; ")));
    args.option_flags.push_back({name, opt});
  }
}

const char* const kFileInputs = "File model inputs";
const char* const kCompiled = "Compiled training (Python models)";
const char* const kPolicies = "Op-level checkpointing and offloading (Python models)";
const char* const kParallel = "Data-parallel training (Python models)";

// How a file model's inputs are made, and its training flags.
OptionTable<ModelArgs> file_input_rows() {
  OptionTable<ModelArgs> t;
  t.push_back(OptionRow<ModelArgs>("--input-shape", "shape of a seeded random input, as 2,3,224,224", &ModelArgs::input_shape)
                  .group(kFileInputs));
  t.push_back(OptionRow<ModelArgs>("--input-dtype", "float32, float64, float16, bfloat16, int64 or int32", &ModelArgs::input_dtype)
                  .group(kFileInputs));
  t.push_back(OptionRow<ModelArgs>("--input-range", "LO,HI: integers in [LO, HI) for token ids; uniform in [LO, HI) for floats",
                                   &ModelArgs::input_range)
                  .group(kFileInputs));
  t.push_back(OptionRow<ModelArgs>("--input", "a file of input tensors saved from Python (torch.save of a tensor, list or tuple)",
                                   &ModelArgs::input_file)
                  .field("input_file")
                  .group(kFileInputs));
  t.push_back(OptionRow<ModelArgs>("--mode",
                                   "training flags: as-saved (each module's flag as exported: a BatchNorm frozen in eval "
                                   "stays frozen), train or eval (every module)",
                                   &ModelArgs::mode)
                  .check(CLI::IsMember({"as-saved", "train", "eval"}))
                  .group(kFileInputs));
  return t;
}

}  // namespace

namespace {

// What is checkpointed and how: the checkpoint under test, the compiler's, op-level policies, offloading.
void add_checkpoint_rows(OptionTable<ModelArgs>& t) {
  t.push_back(OptionRow<ModelArgs>("--checkpoint",
                                   "the checkpoint under test: auto (default: for a Python model its own switch when "
                                   "it has one -- gradient_checkpointing_enable(), timm's set_grad_checkpointing() or "
                                   "the factory's enable/disable --, else torch; ckcheck for the others), ckcheck "
                                   "(ckcheck's own, every model), and for Python models torch (torch.utils.checkpoint, "
                                   "use_reentrant=False), torch-reentrant (use_reentrant=True), torch-sac (non-reentrant with an "
                                   "op-level policy: --sac-save or the factory's context_fn), torch-wrapper (PyTorch's "
                                   "checkpoint_wrapper around each unit, as apply_activation_checkpointing applies it) "
                                   "or model (the model's own switch); the reference is always the model without "
                                   "checkpoints",
                                   &ModelArgs::checkpoint)
                  .check(CLI::IsMember(checkpoint_option_names()))
                  .config("checkpoint"));
  t.push_back(OptionRow<ModelArgs>("--compile",
                                   "train the Python model compiled (torch.compile, inductor): the eager plain step, "
                                   "the compiled plain step (the reference) and the compiled checkpointed step are "
                                   "compared; the checkpoints run inside the compiled graph",
                                   &ModelArgs::compile)
                  .group(kCompiled)
                  .config("compile"));
  t.push_back(OptionRow<ModelArgs>("--compile-mode",
                                   "torch.compile's mode with --compile: default, reduce-overhead or "
                                   "max-autotune-no-cudagraphs",
                                   &ModelArgs::compile_mode)
                  .check(CLI::IsMember({"default", "reduce-overhead", "max-autotune-no-cudagraphs"}))
                  .group(kCompiled)
                  .config("compile_mode"));
  t.push_back(OptionRow<ModelArgs>("--memory-budget",
                                   "with --compile, the compiler's activation memory budget in the checkpointed step, "
                                   "0 to 1 (0: recompute what it can; 1, the default: the compiler's own choice); "
                                   "below 1 with --checkpoint auto, the budget alone decides what is recomputed",
                                   &ModelArgs::memory_budget)
                  .check(finite_number(0, 1))
                  .group(kCompiled)
                  .config("memory_budget"));
  t.push_back(OptionRow<ModelArgs>("--sac-save",
                                   "with --checkpoint torch-sac, the ops the checkpointed units save, comma-separated "
                                   "(aten.mm,aten.bmm or an overload, aten.mm.default); every other op is recomputed "
                                   "(selective activation checkpointing)",
                                   &ModelArgs::sac_save)
                  .check(non_empty("ops, as aten.mm,aten.bmm"))
                  .group(kPolicies)
                  .config("sac_save"));
  t.push_back(OptionRow<ModelArgs>("--offload",
                                   "off, or cpu: run the checkpointed step with its saved activations offloaded "
                                   "(saved-tensor hooks that copy each one to the CPU in the forward and back in the "
                                   "backward; the factory's 'offload' when it gives one); compared with the plain "
                                   "step without offloading",
                                   &ModelArgs::offload)
                  .check(CLI::IsMember({"off", "cpu"}))
                  .group(kPolicies)
                  .config("offload"));
}

// The data-parallel engine and its precision.
void add_parallel_rows(OptionTable<ModelArgs>& t) {
  t.push_back(OptionRow<ModelArgs>("--parallel",
                                   "off, ddp or fsdp: with --world-size N (or under torchrun), train the Python model "
                                   "data-parallel in PyTorch's DistributedDataParallel (ddp; options from the "
                                   "factory's 'ddp' dict) or sharded by FSDP2's fully_shard on each block and the "
                                   "root (fsdp; the factory's 'fsdp' dict: reshard_after_forward, modules), Gloo "
                                   "over loopback on the CPU; compared with one process on the whole batch and with "
                                   "the plain step under the same engine",
                                   &ModelArgs::parallel)
                  .check(CLI::IsMember({"off", "ddp", "fsdp"}))
                  .group(kParallel)
                  .config("parallel"));
  t.push_back(OptionRow<ModelArgs>("--mixed-precision",
                                   "off, bf16 or fp16: under --parallel fsdp, FSDP2's MixedPrecisionPolicy with the "
                                   "parameters in that dtype and gradients reduced in float32 (the one-process "
                                   "reference stays in float32, compared within that precision)",
                                   &ModelArgs::mixed_precision)
                  .check(CLI::IsMember({"off", "bf16", "fp16"}))
                  .group(kParallel)
                  .config("mixed_precision"));
}

// Which sites, which policy, and the step: inputs' gradients, seed, steps, device, autocast.
void add_step_rows(OptionTable<ModelArgs>& t) {
  t.push_back(OptionRow<ModelArgs>("--input-requires-grad",
                                   "make every floating-point input require grad and compare input gradients "
                                   "(default: inputs as the model gives them -- a training batch does not require "
                                   "grad, and a reentrant checkpoint behaves differently when one does)",
                                   &ModelArgs::input_requires_grad)
                  .config("input_requires_grad"));
  t.push_back(OptionRow<ModelArgs>("--sites",
                                   "where checkpoints may go: globs over module paths, comma-separated or repeated "
                                   "(default: the model's own blocks); '*' matches dots too, as in '*.attn'",
                                   &ModelArgs::sites)
                  .check(non_empty("a glob over module paths, as 'blocks.*'"))
                  .config("sites"));
  t.push_back(OptionRow<ModelArgs>("--policy",
                                   "which candidate sites are checkpointed: none, every:K, segments[:N] (N defaults to "
                                   "sqrt of the candidates), sites:GLOB[,GLOB]",
                                   &ModelArgs::policy)
                  .always());
  t.push_back(OptionRow<ModelArgs>("--seed", "seed for parameters, inputs, dropout and upstream gradients (0 to 2^64-1)",
                                   &ModelArgs::seed)
                  .check(whole_number(0, UINT64_MAX))
                  .always()
                  .config("seed"));
  t.push_back(OptionRow<ModelArgs>("--steps", "training steps, with an SGD update between them", &ModelArgs::steps)
                  .check(whole_number(1, 10000))
                  .config("steps"));
  t.push_back(OptionRow<ModelArgs>("--device", "cpu, cuda or cuda:N", &ModelArgs::device));
  t.push_back(OptionRow<ModelArgs>("--amp", "autocast: off, bf16 (CPU or CUDA) or fp16 (CUDA)", &ModelArgs::amp));
}

}  // namespace

const OptionTable<ModelArgs>& model_option_table() {
  static const OptionTable<ModelArgs> table = [] {
    std::vector<std::string> names;
    for (const auto& s : builtin_models()) names.push_back(s.name);
    OptionTable<ModelArgs> t;
    t.push_back(OptionRow<ModelArgs>(
                    "--model", fmt::format("the model: a built-in one ({}), the path of a TorchScript file, or a "
                                           "Python factory FILE.py[:CALLABLE] or package.module:CALLABLE (CALLABLE "
                                           "defaults to make_model) that returns an nn.Module, (module, inputs[, loss]) "
                                           "or a dict with model and any of inputs, args, kwargs, loss, enable, disable; "
                                           "inputs: a tensor, a tuple of positional or a dict of keyword arguments",
                                           fmt::join(names, ", ")),
                    &ModelArgs::model)
                    .required()
                    .always());
    const auto inputs = file_input_rows();
    t.insert(t.end(), inputs.begin(), inputs.end());
    add_checkpoint_rows(t);
    add_parallel_rows(t);
    add_step_rows(t);
    return t;
  }();
  return table;
}

namespace {

// The rows a command takes: all, less --policy and the compiler's --memory-budget for commands that
// take several policies (bench: its --memory-budget is a size, and budgets are policies there), less
// --offload where the command does not take it, and less --steps for those that count their own.
std::function<bool(const OptionRow<ModelArgs>&)> model_rows(bool with_policy, bool with_steps, bool with_offload,
                                                            bool with_parallel) {
  return [with_policy, with_steps, with_offload, with_parallel](const OptionRow<ModelArgs>& row) {
    const auto& f = row.flag();
    if (f == "--policy" || f == "--memory-budget") return with_policy;
    if (f == "--parallel" || f == "--mixed-precision") return with_policy || with_parallel;
    if (f == "--offload") return with_offload;
    if (f == "--steps") return with_steps;
    return true;
  };
}

}  // namespace

void add_model_args(CLI::App& app, ModelArgs& args, bool with_policy, bool with_steps, bool with_offload,
                    bool with_parallel) {
  for (const auto& [row, opt] : add_options(app, args, model_option_table(),
                                            model_rows(with_policy, with_steps, with_policy || with_offload, with_parallel))) {
    if (row->group_name() != kFileInputs) continue;
    // A file model's input options, noted when given: a built-in model refuses them.
    opt->each([&args, flag = row->flag()](const std::string&) { args.torchscript_flags.push_back(flag); });
  }
  app.get_option_group(kFileInputs)->description("for --model PATH.pt and Python factories that return no inputs");
  add_builtin_model_options(app, args);
}

torch::Device parse_device(const std::string& text) {
  c10::optional<torch::Device> device;
  try {
    device = torch::Device(text);
  } catch (const std::exception&) {
  }
  if (!device || !(device->is_cpu() || device->is_cuda())) {
    throw UsageError(fmt::format("unknown --device '{}'; valid: cpu, cuda, cuda:N", text));
  }
  if (device->is_cuda()) {
    if (!torch::cuda::is_available()) {
      throw UsageError("--device " + text + ": no CUDA device is available to this build of ckcheck (a CPU LibTorch, or no GPU); use --device cpu");
    }
    const int64_t index = device->has_index() ? device->index() : 0;
    if (index >= static_cast<int64_t>(torch::cuda::device_count())) {
      throw UsageError(fmt::format("--device {}: there are {} CUDA devices", text, torch::cuda::device_count()));
    }
  }
  return *device;
}

namespace {
bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}
bool looks_like_path(const std::string& name) {
  auto ends = [&name](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".pt") || ends(".pth") || ends(".zip") || ends(".ts") || name.find('/') == 0 ||
         name.rfind("./", 0) == 0 || name.rfind("../", 0) == 0;
}
}  // namespace

bool is_python_model(const std::string& model) {
  const auto colon = model.rfind(':');
  const auto file = model.substr(0, colon);
  const auto ends_py = file.size() > 3 && file.compare(file.size() - 3, 3, ".py") == 0;
  if (ends_py) return true;
  if (colon == std::string::npos || colon == 0 || colon + 1 == model.size()) return false;
  // package.module:callable, identifiers only
  auto ident = [](const std::string& s, bool dots) {
    if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
    return std::all_of(s.begin(), s.end(), [dots](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || (dots && c == '.');
    });
  };
  return ident(file, true) && ident(model.substr(colon + 1), false);
}

namespace {
PythonModelLoader& python_loader() {
  static PythonModelLoader loader;
  return loader;
}
}  // namespace

void set_python_model_loader(PythonModelLoader loader) { python_loader() = std::move(loader); }

namespace {

// The options a Python model's run combines, checked before its factory runs.
void check_python_options(const ModelArgs& args, int world_size, const std::map<std::string, std::string>& given) {
  if (!given.empty()) {
    throw UsageError(fmt::format("--{} is an option of the built-in models; a Python factory makes "
                                 "its own model (inputs: --input-shape, --input-dtype, --input-range or --input)",
                                 given.begin()->first));
  }
  if (!python_loader()) {
    throw UsageError(fmt::format("--model {} is a Python model; run it as `python -m ckcheck` with the "
                                 "ckcheck Python package installed", args.model));
  }
  const ParallelKind parallel = args.parallel_kind();
  if (world_size > 1 && parallel == ParallelKind::kOff) {
    throw UsageError("a Python model trains data-parallel in PyTorch's own engines: add --parallel ddp or "
                     "--parallel fsdp to --world-size");
  }
  if (parallel != ParallelKind::kOff && world_size <= 1 && !std::getenv("WORLD_SIZE")) {
    throw UsageError(fmt::format("--parallel {} trains on several ranks: add --world-size N (2 or more), or start "
                                 "ckcheck under torchrun",
                                 args.parallel));
  }
  if (args.mixed_precision != "off" && parallel != ParallelKind::kFsdp) {
    throw UsageError("--mixed-precision is FSDP2's MixedPrecisionPolicy; add --parallel fsdp (in one process, "
                     "autocast is --amp)");
  }
  if (!args.sac_save.empty() && args.checkpoint_kind() != CheckpointKind::kTorchSac) {
    throw UsageError("--sac-save is the op policy of selective checkpointing; add --checkpoint torch-sac");
  }
  if (!args.compile && (args.compile_mode != "default" || args.memory_budget != 1.0)) {
    throw UsageError(fmt::format("{} applies to compiled training; add --compile",
                                 args.compile_mode != "default" ? "--compile-mode" : "--memory-budget"));
  }
}

// What only a Python model takes, refused for a C++ or TorchScript one.
void refuse_python_only_options(const ModelArgs& args) {
  for (const auto& [given_flag, python_only] : {std::pair<const char*, bool>{"--sac-save", !args.sac_save.empty()},
                                                {"--offload", args.offload != "off"},
                                                {"--parallel", args.parallel != "off"},
                                                {"--mixed-precision", args.mixed_precision != "off"}}) {
    if (python_only) {
      throw UsageError(fmt::format("{} applies to Python models (--model FILE.py:make_model); {} is not one", given_flag,
                                   args.model));
    }
  }
  if (args.compile || args.compile_mode != "default" || args.memory_budget != 1.0) {
    throw UsageError(fmt::format("--compile applies to Python models (--model FILE.py:make_model); {} is not one",
                                 args.model));
  }
  if (args.checkpoint_kind() != CheckpointKind::kCkcheck && args.checkpoint_kind() != CheckpointKind::kAuto) {
    throw UsageError(fmt::format("--checkpoint {} applies to Python models (--model FILE.py:make_model); "
                                 "ckcheck checks its own checkpoint on {}", args.checkpoint, args.model));
  }
}

std::unique_ptr<Model> torchscript_model(const ModelArgs& args, const std::map<std::string, std::string>& given) {
  if (!given.empty()) {
    throw UsageError(fmt::format("--{} is an option of the built-in models; a TorchScript model "
                                 "takes --input-shape, --input-dtype, --input-range or --input",
                                 given.begin()->first));
  }
  TorchScriptInputs inputs;
  inputs.random = RandomInput::parse(args.input_shape, args.input_dtype, args.input_range);
  inputs.file = args.input_file;
  inputs.mode = args.mode;
  return load_torchscript_model(args.model, inputs, args.seed);
}

}  // namespace

std::unique_ptr<Model> build_model(const ModelArgs& args, int world_size, CheckpointChoice* chosen) {
  set_phase("loading the model (its factory or file)");
  CheckpointChoice ignored;
  CheckpointChoice& choice = chosen ? *chosen : ignored;
  const auto given = args.given_options();
  if (is_python_model(args.model)) {
    check_python_options(args, world_size, given);
    return python_loader()(args, choice);
  }
  refuse_python_only_options(args);
  choice = {CheckpointKind::kCkcheck,
            args.checkpoint_kind() == CheckpointKind::kAuto ? "the default for C++ and TorchScript models" : "asked for"};
  bool builtin = false;
  for (const auto& spec : builtin_models()) builtin = builtin || spec.name == args.model;
  // A built-in name wins over a file of that name in the working folder (write ./NAME for the file).
  if (!builtin && (exists(args.model) || looks_like_path(args.model))) return torchscript_model(args, given);
  if (!args.torchscript_flags.empty()) {
    throw UsageError(fmt::format("{} applies to TorchScript models (--model PATH.pt), not to the "
                                 "built-in model {}",
                                 args.torchscript_flags.front(), args.model));
  }
  return make_model(args.model, given, args.seed, world_size);
}

RunConfig run_config(const ModelArgs& args) {
  RunConfig c;
  c.seed = args.seed;
  c.steps = args.steps;
  c.device = parse_device(args.device);
  c.amp = parse_amp(args.amp);
  c.input_requires_grad = args.input_requires_grad;
  if (c.amp == Amp::kFp16 && !c.device.is_cuda()) {
    throw UsageError("--amp fp16 is CUDA's autocast; on the CPU use --amp bf16");
  }
  return c;
}

namespace {

// A protection flag sets the checkpoint ckcheck puts around the sites. Where that is not the
// checkpoint under test, or that checkpoint has no such setting, the flag would change nothing:
// it is refused with what to do instead, never ignored.
void refuse_unheld_protections(const CheckpointProtections& p, const CheckpointChoice& checkpoint) {
  const bool own = checkpoint.kind == CheckpointKind::kModel || checkpoint.kind == CheckpointKind::kCompiler;
  if (!p.preserve_rng_state && own) {
    throw UsageError(fmt::format(
        "--no-preserve-rng sets the checkpoint ckcheck puts around the sites; under the {} checkpoint the model's "
        "own decides whether its recompute replays the RNG (preserve_rng_state in its switch's kwargs): drop "
        "--no-preserve-rng, or set it there",
        checkpoint.name()));
  }
  if (checkpoint.kind == CheckpointKind::kCkcheck) return;
  const std::pair<const char*, bool> ckcheck_only[] = {{"--no-restore-autocast", !p.restore_autocast},
                                                       {"--no-check-inputs", !p.check_input_versions},
                                                       {"--recompute-fp32", p.recompute_fp32}};
  for (const auto& [flag, given] : ckcheck_only) {
    if (given) {
      throw UsageError(fmt::format("{} is a setting of ckcheck's own checkpoint (--checkpoint ckcheck); the {} "
                                   "checkpoint has none: drop it, or check with --checkpoint ckcheck",
                                   flag, checkpoint.name()));
    }
  }
}

}  // namespace

void fit_to_checkpoint(RunConfig& config, const CheckpointChoice& checkpoint) {
  refuse_unheld_protections(config.checkpoint, checkpoint);
  if (checkpoint.kind == CheckpointKind::kTorchSac) config.probe_every_unit = true;
}

ModelInfo model_info(Model& model, const Plan& plan, const CheckpointChoice& checkpoint, const RunConfig& config) {
  ModelInfo info;
  info.checkpoint = checkpoint.name();
  info.checkpoint_reason = checkpoint.reason;
  for (const auto& x : model.make_inputs(config.seed)) {
    const bool grad = x.requires_grad() || (config.input_requires_grad && x.is_floating_point());
    info.inputs.push_back({x.sizes().vec(), std::string(c10::toString(x.scalar_type())), grad});
  }
  info.name = model.name();
  info.options = model.options();
  info.sites = model.sites();
  info.candidates = plan.candidates;
  info.checkpointed = plan.checkpointed();
  for (const auto& u : plan.units) info.units.push_back(Plan::unit_label(u));
  info.policy = plan.policy.text();
  info.eval_modules = model.eval_modules();
  return info;
}

std::string model_command_line(const ModelArgs& args, bool with_policy) {
  // --model first, then the built-in model's options given, then the other rows in table order.
  const auto& table = model_option_table();
  std::string s = table.front().reproduce(args).substr(1);
  for (const auto& [k, v] : args.given_options()) s += fmt::format(" --{} {}", k, shell_quote(v));
  const auto keep = model_rows(with_policy, true, /*with_offload=*/true, /*with_parallel=*/true);  // printed where given
  for (size_t i = 1; i < table.size(); ++i) {
    if (keep(table[i])) s += table[i].reproduce(args);
  }
  return s;
}

void add_report_option(CLI::App& app, std::vector<std::string>& reports, const std::string& note) {
  app.add_option("--report", reports,
                 fmt::format("FORMAT or FORMAT=PATH, repeatable: {} (console to standard output by default; PATH '-' "
                             "is standard output){}",
                             fmt::join(report_formats(), ", "), note))
      ->type_name("FORMAT[=PATH]");
}

namespace {

// The files an input spec names: the spec itself; a FILE.py:CALLABLE's file; a package.module's
// source (package/module.py, package/module/__init__.py) under the working folder. Only the ones
// that exist count (report_targets compares files by identity).
std::vector<std::string> files_named_by(const std::string& spec) {
  std::vector<std::string> out{spec};
  const auto colon = spec.rfind(':');
  const std::string path = colon == std::string::npos ? spec : spec.substr(0, colon);
  out.push_back(path);
  if (path.find('/') == std::string::npos && path.size() < 4096) {
    std::string module = path;
    std::replace(module.begin(), module.end(), '.', '/');
    out.push_back(module + ".py");
    out.push_back(module + "/__init__.py");
  }
  return out;
}

}  // namespace

std::vector<ReportTarget> report_targets(const std::vector<std::string>& reports,
                                        const std::vector<std::string>& specs) {
  std::vector<std::string> inputs;
  for (const auto& spec : specs) {
    if (spec.empty()) continue;
    for (auto& f : files_named_by(spec)) inputs.push_back(std::move(f));
  }
  std::vector<ReportTarget> out;
  bool to_stdout = false;
  // Files by identity, so that two spellings of one file (or a link to it) are caught.
  auto identity = [](const std::string& path) -> std::optional<std::pair<dev_t, ino_t>> {
    struct stat st;
    if (path.empty() || stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    return std::make_pair(st.st_dev, st.st_ino);
  };
  std::map<std::pair<dev_t, ino_t>, std::string> taken;
  std::map<std::string, std::string> by_path;  // file reports by their resolved path (parse_report_target)
  for (const auto& in : inputs) {
    if (const auto id = identity(in)) taken.emplace(*id, "the input file '" + in + "'");
  }
  for (const auto& r : reports) {
    out.push_back(parse_report_target(r));
    const auto& t = out.back();
    to_stdout = to_stdout || t.sink == ReportTarget::Sink::kStdout;
    if (t.sink != ReportTarget::Sink::kFile) continue;
    const auto id = identity(t.path);
    const auto clash = id ? taken.find(*id) : taken.end();
    const auto twice = by_path.find(t.path);
    if (clash != taken.end() || twice != by_path.end()) {
      throw UsageError(fmt::format("--report {} would overwrite {}; give each report its own file", r,
                                   clash != taken.end() ? clash->second : "--report " + twice->second));
    }
    if (id) taken[*id] = "--report " + r;
    by_path[t.path] = r;
  }
  // Standard output takes one report; the console summary comes unless another report goes there,
  // and while one does, what the model prints goes to standard error.
  std::vector<std::string> on_stdout;
  for (const auto& t : out) {
    if (t.sink == ReportTarget::Sink::kStdout) on_stdout.push_back(t.given);
  }
  if (on_stdout.size() > 1) {
    throw UsageError(fmt::format("--report {} and --report {} both go to standard output, which takes one report; "
                                 "send the others to files", on_stdout[0], on_stdout[1]));
  }
  if (!to_stdout) out.insert(out.begin(), ReportTarget{"console", "", ReportTarget::Sink::kStdout, "console"});
  if (to_stdout) hold_stdout_for_report();
  return out;
}

CLI::Validator whole_number(uint64_t lo, uint64_t hi) {
  const auto range = fmt::format("a whole number from {} to {}", lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        bool digits = !text.empty() && text.size() <= 20;
        for (char c : text) digits = digits && c >= '0' && c <= '9';
        errno = 0;
        const unsigned long long v = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
        if (!digits || errno == ERANGE || v < lo || v > hi) return fmt::format("'{}' is not {}", text, range);
        return "";
      },
      "", "WHOLE");
}

CLI::Validator finite_number(double lo, double hi, bool lo_open) {
  const auto range = fmt::format("a number {}{:g}, at most {:g}", lo_open ? "above " : "at least ", lo, hi);
  return CLI::Validator(
      [lo, hi, lo_open, range](std::string& text) -> std::string {
        const auto v = parse_double(text);
        if (!v || *v < lo || (lo_open && *v == lo) || *v > hi) return fmt::format("'{}' is not {}", text, range);
        return "";
      },
      "", "FINITE");
}

CLI::Validator non_empty(const std::string& what) {
  return CLI::Validator([what](std::string& item) -> std::string { return item.empty() ? "an empty value; give " + what : ""; },
                        "", "NONEMPTY");
}

int max_threads() { return 4 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

bool use_color() { return isatty(STDOUT_FILENO) && std::getenv("NO_COLOR") == nullptr; }

std::vector<std::string> split_list(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const auto& item : items) {
    size_t start = 0;
    while (start <= item.size()) {
      const auto comma = item.find(',', start);
      const auto part = item.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!part.empty()) out.push_back(part);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return out;
}

}  // namespace ckcheck::cli
