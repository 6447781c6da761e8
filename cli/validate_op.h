// `ckcheck validate-op`: is a custom op safe to recompute under a checkpoint?
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "cli/option_table.h"
#include "reports/report.h"

namespace ckcheck::cli {

struct ValidateOpOptions {
  std::string library;
  std::string import_module;  // a Python module that registers the op (--import)
  std::string op;
  std::string shapes;
  std::string dtype = "float32";
  uint64_t seed = 0;
  int cases = 10;
  int timeout = 0;  // --timeout: the whole command's wall-clock limit in seconds (0: none)
  std::vector<std::string> reports;
};

/// The options of `ckcheck validate-op`, one row each (option_table.h).
const OptionTable<ValidateOpOptions>& validate_op_option_table();

void setup_validate_op(CLI::App& app, int& exit_code);

/// Validates the op and returns the report, writing nothing (the Python binding); throws
/// UsageError for bad input.
Report validate_op_report(const ValidateOpOptions& options);

/// 0 when the op is safe to recompute, 1 when it is not; throws UsageError for bad input.
int run_validate_op(const ValidateOpOptions& options);

/// Imports a Python module by name; throws UsageError (one line) when it cannot.
using PythonImporter = std::function<void(const std::string&)>;
/// Set by the ckcheck Python package, which runs this CLI in a Python process: how --import
/// imports the module that registers a Python custom op (torch.library).
void set_python_importer(PythonImporter importer);

}  // namespace ckcheck::cli
