// `ckcheck run`: compare plain and checkpointed training steps and report for CI.
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/common.h"
#include "cli/launch.h"
#include "harness/runner/data_parallel.h"

namespace ckcheck::cli {

/// The wall-clock limit of a data-parallel run when --timeout is not given.
constexpr int kRankTimeout = 300;

struct RunOptions {
  ModelArgs model;
  std::string tolerance = "bitwise";
  bool no_preserve_rng = false;
  bool no_restore_autocast = false;
  bool no_check_inputs = false;
  bool restore_buffers = false;
  bool recompute_fp32 = false;
  std::vector<std::string> checks;
  std::vector<std::string> reports;
  /// --baseline FILE: a baseline (or JSON report) the verdict, checks and causes must match.
  std::string baseline;
  /// --export FILE: write this run's baseline there (--report baseline=FILE).
  std::string export_to;
  /// --plant CLASS@SITE: a bug planted into one site (what ckcheck selftest does per cell).
  std::string plant;
  /// The RunConfig fields an option sets as they are (--lr, --accumulate); run_config adds the
  /// model's and the protections'.
  RunConfig config;
  /// --schedule: the order of the micro-batches' forwards and backwards (parse_schedule).
  std::string schedule = "sequential";
  bool diagnose = false;
  bool bench = false;
  int world_size = 1;
  /// Wall-clock limit of the run in seconds; 0 (not given): none for one process, kRankTimeout
  /// for a data-parallel run.
  int timeout = 0;
  /// The knobs of the checks this command can run (CheckKnob::name -> value), at their defaults
  /// unless given.
  std::map<std::string, double> knobs;
};

/// The options of `ckcheck run` beyond the model's and the checks' knobs, one row each
/// (option_table.h); diagnose takes the rows marked shared.
const OptionTable<RunOptions>& run_option_table();

/// Adds the run subcommand; its result goes to `exit_code`.
void setup_run(CLI::App& app, int& exit_code);

/// Options at their defaults, the checks' knobs included (what the command line starts from).
RunOptions default_run_options();

/// What a run works on, set up once: the model, its plan and run config, the tolerance and checks,
/// and on a rank of a data-parallel run its process group and engine.
struct RunSetup {
  std::unique_ptr<Model> model;
  Plan plan;
  RunConfig config;
  Tolerance tolerance;
  CheckpointChoice checkpoint;
  std::vector<std::unique_ptr<Check>> checks;
  std::optional<RankEnvironment> env;
  std::unique_ptr<Collective> collective;
  std::unique_ptr<DataParallel> dp;
  std::string identity;  // what every rank must run alike
};

/// Builds what `options` ask for; nullopt where this process starts the ranks of a data-parallel run
/// instead (`status` gets theirs). Throws UsageError for bad input.
std::optional<RunSetup> set_up_run(const RunOptions& options, int& status);

/// The steps and checks of one run on `setup` through `runner` (the ranks' records gathered on rank
/// 0); throws UsageError where the plain step itself fails.
RunOutcome run_once(RunSetup& setup, Runner& runner, const RunOptions& options);

/// Runs in this process and returns the report, writing nothing (the Python binding); throws
/// UsageError for bad input, FieldError for a data-parallel run or a --timeout (the
/// deadline ends the process).
Report run_in_process(const RunOptions& options);

/// Runs with parsed options; returns the exit code (0 pass, 1 a check failed). Throws UsageError
/// for bad input.
int run_run(const RunOptions& options);

/// `command` ("run" or "diagnose") with parsed options, in this process or on the ranks it starts
/// or is one of; writes the reports and returns the exit code. Throws UsageError for bad input.
int run_and_report(const RunOptions& options, const std::string& command);

/// The options of a run as a command line (what reports print under "reproduce").
std::string run_command_line(const RunOptions& options);

/// The run's flags for the protections, and --NAME for the knob of each of `checks` (shared with
/// diagnose, which runs the checks run by default).
void add_run_flags(CLI::App& app, RunOptions& options, const std::vector<std::unique_ptr<Check>>& checks);

/// The report's config: every option, defaults included: the rows with a config key as given, and
/// what the others make (the policy's text, the device, the protections, the checks run).
/// `collective` is null in one process; `checkpoint` is the checkpoint under test (config
/// "checkpoint", with "checkpoint_reason").
nlohmann::json run_report_config(const RunOptions& options, const Plan& plan, const RunConfig& config,
                                 const Tolerance& tolerance, const Collective* collective,
                                 const std::vector<std::unique_ptr<Check>>& checks,
                                 const CheckpointChoice& checkpoint);

/// Under a checkpoint other than ckcheck's (PyTorch's, or the one a model's own switch calls), a
/// finding's or diagnosed site's default fix becomes what a torch user can do (ckcheck's names
/// --restore-buffers, is_recomputing(), ...); hints a check wrote for the case stay.
void speak_of_the_checkpoint(CheckpointKind checkpoint, Report& report);

/// RunConfig with the protection flags applied.
RunConfig run_config(const RunOptions& options);

}  // namespace ckcheck::cli
