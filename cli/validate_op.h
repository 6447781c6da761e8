// `ckcheck validate-op`: is a custom op safe to recompute under a checkpoint?
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "cli/option_table.h"

namespace ckcheck::cli {

struct ValidateOpOptions {
  std::string library;
  std::string op;
  std::string shapes;
  std::string dtype = "float32";
  uint64_t seed = 0;
  int cases = 10;
  std::vector<std::string> reports;
};

/// The options of `ckcheck validate-op`, one row each (option_table.h).
const OptionTable<ValidateOpOptions>& validate_op_option_table();

void setup_validate_op(CLI::App& app, int& exit_code);

/// 0 when the op is safe to recompute, 1 when it is not; throws UsageError for bad input.
int run_validate_op(const ValidateOpOptions& options);

}  // namespace ckcheck::cli
