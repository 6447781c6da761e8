#pragma once

#include <CLI/CLI.hpp>

#include <ostream>

namespace ckcheck::cli {

void setup_list(CLI::App& app, int& exit_code);
int run_list(std::ostream& out);

}  // namespace ckcheck::cli
