// `ckcheck bench`: memory and time of each checkpoint policy, with a recommendation.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/common.h"

namespace ckcheck::cli {

struct BenchCliOptions {
  ModelArgs model;
  std::vector<std::string> policies;
  int64_t steps = 10;
  int64_t warmup = 2;
  std::string memory_budget;
  double max_overhead = find_knob("max-overhead").default_value;  // the overhead check's
  double time_budget = 60;
  int threads = 0;
  std::vector<std::string> reports;
};

void setup_bench(CLI::App& app, int& exit_code);

/// Returns 0 once measured (a measurement is not a verdict); throws UsageError for bad input.
int run_bench_command(const BenchCliOptions& options);

}  // namespace ckcheck::cli
