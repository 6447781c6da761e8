// `ckcheck diagnose`: where and why a checkpointed run diverges or turns NaN.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/run.h"

namespace ckcheck::cli {

void setup_diagnose(CLI::App& app, int& exit_code);

/// Returns 0 when nothing diverges and nothing is NaN, 1 otherwise. Throws UsageError for bad
/// input.
int run_diagnose(const RunOptions& options);

}  // namespace ckcheck::cli
