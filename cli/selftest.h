// `ckcheck selftest`: each class of bug ckcheck claims to catch, planted into the user's own model and
// configuration, and whether the checks caught it with the right cause.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "cli/run.h"

namespace ckcheck::cli {

struct SelftestOptions {
  RunOptions run;                   // the model and the run's options, as `ckcheck run` takes them
  std::vector<std::string> plants;  // the classes to plant (default: every one the configuration supports)
  bool every_site = false;          // plant each class at every checkpointed unit, not at a sample
};

void setup_selftest(CLI::App& app, int& exit_code);

/// Returns 0 when the unplanted model passes, every live plant is caught (with the right cause or
/// another) and no dormant one fails; 1 otherwise. Throws UsageError for bad input.
int run_selftest(const SelftestOptions& options);

/// The selftest in this process, writing nothing (the Python binding). Throws UsageError for bad
/// input, FieldError for a data-parallel run or a --timeout.
Report selftest_in_process(const SelftestOptions& options);

}  // namespace ckcheck::cli
