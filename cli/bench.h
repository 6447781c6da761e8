// `ckcheck bench`: memory and time of each checkpoint policy, with a recommendation.
#pragma once

#include <CLI/CLI.hpp>

#include "checks/overhead.h"
#include "cli/common.h"

namespace ckcheck::cli {

struct BenchCliOptions {
  ModelArgs model;
  std::vector<std::string> policies;
  int64_t steps = 10;
  int64_t warmup = 2;
  std::string memory_budget;
  double max_overhead = max_overhead_knob().default_value;  // the overhead check's knob
  double time_budget = 60;
  int threads = 0;
  std::string tolerance = "bitwise";  // of the checks each policy's checkpointed step must pass
  // --parallel: the ranks on this machine, and the wall-clock limit of the whole run (0: 300 s).
  int world_size = 1;
  int timeout = 0;
  std::vector<std::string> reports;
};

/// The options of `ckcheck bench` beyond the model's, one row each (option_table.h).
const OptionTable<BenchCliOptions>& bench_option_table();

void setup_bench(CLI::App& app, int& exit_code);

/// Returns 0 once measured (a measurement is not a verdict); throws UsageError for bad input.
int run_bench_command(const BenchCliOptions& options);

}  // namespace ckcheck::cli
