// `ckcheck run`: compare plain and checkpointed training steps and report for CI.
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/common.h"

namespace ckcheck::cli {

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
  double lr = 0.01;
  bool diagnose = false;
  bool bench = false;
  int world_size = 1;
  int timeout = 300;
  int64_t accumulate = 1;  // micro-batches per step (gradient accumulation)
  /// The knobs of the checks this command can run (CheckKnob::name -> value), at their defaults
  /// unless given.
  std::map<std::string, double> knobs;
};

/// Adds the run subcommand; its result goes to `exit_code`.
void setup_run(CLI::App& app, int& exit_code);

/// Runs with parsed options; returns the exit code (0 pass, 1 a check failed). Throws UsageError
/// for bad input.
int run_run(const RunOptions& options);

/// The options of a run as a command line (what reports print under "reproduce").
std::string run_command_line(const RunOptions& options);

/// The run's flags for the protections, and --NAME for the knob of each of `checks` (shared with
/// diagnose, which runs the checks run by default).
void add_run_flags(CLI::App& app, RunOptions& options, const std::vector<std::unique_ptr<Check>>& checks);

/// RunConfig with the protection flags applied.
RunConfig run_config(const RunOptions& options);

}  // namespace ckcheck::cli
