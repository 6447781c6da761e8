#include "cli/app.h"

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>

#include "cli/bench.h"
#include "cli/diagnose.h"
#include "cli/launch.h"
#include "cli/list.h"
#include "cli/run.h"
#include "cli/validate_op.h"
#include "harness/support/errors.h"
#include "reports/report.h"

namespace ckcheck::cli {
namespace {

// The first line of an error, without c10's "Exception raised from" trailer.
std::string first_line(std::string s) {
  const auto cut = s.find("\nException raised from");
  if (cut != std::string::npos) s = s.substr(0, cut);
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

int fail_usage(const std::string& message) {
  std::cerr << "ckcheck: error: " << first_line(message) << "\n";
  return 2;
}

}  // namespace

std::string flag_for_field(const std::string& field) {
  for (const auto& flag : {flag_of(model_option_table(), field), flag_of(run_option_table(), field),
                           flag_of(bench_option_table(), field), flag_of(validate_op_option_table(), field)}) {
    if (!flag.empty()) return flag;
  }
  std::string words = field;
  std::replace(words.begin(), words.end(), '_', '-');
  return "--" + words;  // a built-in model's option, --report
}

int run_cli(const std::vector<std::string>& args) {
  CLI::App app{"ckcheck: tells whether gradient checkpointing is correct and worth it for a model, "
               "before the GPU time is spent.\nRun `ckcheck COMMAND --help` for a command's options."};
  app.name("ckcheck");
  app.set_version_flag("--version", version_text());
  app.require_subcommand(1, 1);

  set_command_line(args);
  int exit_code = 0;
  setup_run(app, exit_code);
  setup_diagnose(app, exit_code);
  setup_bench(app, exit_code);
  setup_validate_op(app, exit_code);
  setup_list(app, exit_code);

  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const auto subs = app.get_subcommands();
    if (subs.empty() && !args.empty()) {
      std::vector<std::string> names;
      for (const auto* sub : app.get_subcommands({})) names.push_back(sub->get_name());
      return fail_usage(fmt::format("unknown command or option '{}'; commands: {} (see `ckcheck --help`)", args.front(),
                                    fmt::join(names, ", ")));
    }
    const std::string hint = subs.empty() ? "ckcheck --help" : "ckcheck " + subs.front()->get_name() + " --help";
    return fail_usage(std::string(e.what()) + " (see `" + hint + "`)");
  } catch (const FieldError& e) {
    return fail_usage(e.render(flag_for_field));
  } catch (const UsageError& e) {
    return fail_usage(e.what());
  } catch (const c10::Error& e) {
    return fail_usage(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail_usage(e.what());
  }
  return exit_code;
}

}  // namespace ckcheck::cli
