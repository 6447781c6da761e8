// What several subcommands share: the model options, building the model, and the command line
// that reproduces a run.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "harness/runner/data_parallel.h"
#include "harness/support/checkpoint_kind.h"
#include "ckcheck/model.h"
#include "cli/option_table.h"
#include "harness/runner/plan.h"
#include "harness/runner/runner.h"
#include "reports/report.h"

namespace ckcheck::cli {

/// Options that choose and build a model and the steps it runs.
struct ModelArgs {
  std::string model;
  std::vector<std::string> sites;
  std::string policy = "every:1";
  uint64_t seed = 0;
  int64_t steps = 1;
  std::string device = "cpu";
  std::string amp = "off";
  // TorchScript files
  std::string input_shape;
  std::string input_dtype = "float32";
  std::string input_range;
  std::string input_file;
  std::string mode = "as-saved";
  /// The checkpoint under test: auto (the model's own switch, else torch, for Python models;
  /// ckcheck for the others), ckcheck, torch, torch-reentrant, torch-sac or model (Python models).
  std::string checkpoint = "auto";
  /// The checkpoint's kind (parsed from `checkpoint`).
  CheckpointKind checkpoint_kind() const { return parse_checkpoint_kind(checkpoint); }
  /// Every floating-point input requires grad (default: as the model gives them).
  bool input_requires_grad = false;
  // Compiled training (Python models): torch.compile with this mode; the compiler's activation
  // memory budget of the checkpointed step (1: the compiler's default).
  bool compile = false;
  std::string compile_mode = "default";
  double memory_budget = 1.0;
  // Op-level selective checkpointing (--checkpoint torch-sac): the aten ops saved, comma-separated;
  // activation offloading of the checkpointed step: off or cpu (Python models).
  std::string sac_save;
  std::string offload = "off";
  // Data-parallel training through PyTorch's own engines (Python models): off, ddp or fsdp; the limit a
  // rank's process group waits, in seconds (the run's --timeout).
  std::string parallel = "off";
  /// The engine's kind (parsed from `parallel`).
  ParallelKind parallel_kind() const { return parse_parallel_kind(parallel); }
  int parallel_timeout = 300;
  // Under --parallel fsdp: the parameters' dtype of FSDP2's MixedPrecisionPolicy (off, bf16, fp16).
  std::string mixed_precision = "off";

  // Filled by add_model_args: the per-model options (--layers, --hidden, ...).
  std::map<std::string, std::string> raw_options;
  std::vector<std::pair<std::string, CLI::Option*>> option_flags;
  std::vector<std::string> torchscript_flags;  // names of the TorchScript-only options given

  /// The model options given on the command line.
  std::map<std::string, std::string> given_options() const;
};

/// The options that choose and build a model and its steps: --model, the file model's inputs,
/// --checkpoint, --sites, --policy, --seed, --steps, --device, --amp (one row each).
const OptionTable<ModelArgs>& model_option_table();

/// Registers the rows of model_option_table() and the model options of every built-in model.
/// `with_policy` is false for commands that take several policies, `with_steps` for those that
/// count their own; --offload comes with --policy, or alone with `with_offload` (bench), and so do
/// --parallel and --mixed-precision with `with_parallel` (bench).
void add_model_args(CLI::App& app, ModelArgs& args, bool with_policy = true, bool with_steps = true,
                    bool with_offload = false, bool with_parallel = false);

/// The checkpoint a run tests, and why that one (--checkpoint auto resolves by the model).
struct CheckpointChoice {
  CheckpointKind kind = CheckpointKind::kCkcheck;  // never kAuto: resolved
  std::string reason;                              // one sentence
  const char* name() const { return checkpoint_kind_name(kind); }
};

/// Builds the model the arguments name (a built-in fixture, a TorchScript file or a Python
/// factory); throws UsageError on a bad name, option or file. `world_size` is the number of ranks
/// of a data-parallel run; `chosen` (when given) receives the checkpoint under test.
std::unique_ptr<Model> build_model(const ModelArgs& args, int world_size = 1, CheckpointChoice* chosen = nullptr);

/// True when --model names a Python factory: FILE.py[:CALLABLE] or package.module:CALLABLE.
bool is_python_model(const std::string& model);

/// Builds a Python model; set by the Python extension (ckcheck._core), which runs the CLI
/// in-process. Without it a Python model is refused (the ckcheck binary hands such runs to
/// `python -m ckcheck` before parsing).
using PythonModelLoader = std::function<std::unique_ptr<Model>(const ModelArgs&, CheckpointChoice&)>;
void set_python_model_loader(PythonModelLoader loader);

/// The device the arguments name; throws UsageError when it is not available here.
torch::Device parse_device(const std::string& text);

/// RunConfig from the arguments (flags that switch protections off are set by the caller).
RunConfig run_config(const ModelArgs& args);

/// What the checkpoint under test asks of the steps. Under selective checkpointing (torch-sac) a
/// unit's recompute hands back the forward's own outputs for the ops the policy saved, so equal
/// outputs do not show that the ops it recomputed reproduced theirs: every unit is probed
/// (RunConfig::probe_every_unit).
void fit_to_checkpoint(RunConfig& config, const CheckpointChoice& checkpoint);

/// The model part of a report: its sites and plan, the checkpoint under test and its inputs (made
/// from `config`'s seed, requiring grad as the run's steps see them).
ModelInfo model_info(Model& model, const Plan& plan, const CheckpointChoice& checkpoint, const RunConfig& config);

/// "--model transformer --layers 4 ... --seed 0": the model arguments as a command line.
std::string model_command_line(const ModelArgs& args, bool with_policy = true);

/// Registers --report FORMAT[=PATH] (repeatable; every command that writes a report takes it);
/// `note` is added to the help.
void add_report_option(CLI::App& app, std::vector<std::string>& reports, const std::string& note = "");

/// --report targets, validated before any work: each writable, no two the same file, none one of
/// `inputs` -- specs as the options take them (a model FILE.py:CALLABLE or package.module:CALLABLE,
/// a TorchScript or input file, a library, an --import module, a baseline), each protected as every
/// file it names. The console report to standard output is added
/// unless a report already goes there.
std::vector<ReportTarget> report_targets(const std::vector<std::string>& reports,
                                         const std::vector<std::string>& inputs = {});

/// Whether console output gets colour: a terminal, and NO_COLOR unset.
bool use_color();

/// Checks of an option's text, run before CLI11 converts it, so that "-1" never wraps to 2^64-1,
/// "" never becomes 0 and NaN never slips past a range: a whole number in [lo, hi] ...
CLI::Validator whole_number(uint64_t lo, uint64_t hi);
/// ... and a finite number in [lo, hi] (lo excluded when `lo_open`).
CLI::Validator finite_number(double lo, double hi, bool lo_open = false);

/// Refuses an empty item (a list option given '' or 'a,,b'); `what` says what an item is.
CLI::Validator non_empty(const std::string& what);

/// The most intra-op threads --threads accepts: four per hardware thread of this machine.
int max_threads();

/// Parses a comma-separated list, dropping empty items.
std::vector<std::string> split_list(const std::vector<std::string>& items);

}  // namespace ckcheck::cli
