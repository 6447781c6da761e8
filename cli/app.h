// The whole command line: parse, dispatch to a subcommand, map errors to exit status 2 with one
// line on standard error. main() and the tests call it.
#pragma once

#include <string>
#include <vector>

namespace ckcheck::cli {

/// Runs `ckcheck ARGS...` (args without the program name); returns the exit status.
int run_cli(const std::vector<std::string>& args);

/// The flag that sets a field a library error names (FieldError): the option-table row that sets
/// it, a built-in model's option (hidden: --hidden), --report; otherwise the field's words joined
/// by '-'.
std::string flag_for_field(const std::string& field);

}  // namespace ckcheck::cli
