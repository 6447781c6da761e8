// `ckcheck plan`: the fastest checkpoint plan under a memory budget, verified before it is
// recommended.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/common.h"

namespace ckcheck::cli {

struct PlanCliOptions {
  ModelArgs model;
  std::string memory_budget;
  int64_t steps = 6;
  int64_t warmup = 2;
  int64_t profile_steps = 3;
  double time_budget = 30;
  int threads = 0;
  std::string tolerance = "bitwise";
  int timeout = 0;  // --timeout: the whole command's wall-clock limit in seconds (0: none)
  std::vector<std::string> reports;
};

/// The options of `ckcheck plan` beyond the model's, one row each (option_table.h).
const OptionTable<PlanCliOptions>& plan_option_table();

void setup_plan(CLI::App& app, int& exit_code);

/// 0 when a plan passes its checks and its measured peak fits the budget, 1 when none does;
/// throws UsageError for bad input.
int run_plan_command(const PlanCliOptions& options);

}  // namespace ckcheck::cli
