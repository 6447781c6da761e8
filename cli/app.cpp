#include "cli/app.h"

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <set>

#include "cli/bench.h"
#include "cli/diagnose.h"
#include "cli/launch.h"
#include "cli/list.h"
#include "cli/plan.h"
#include "cli/run.h"
#include "cli/selftest.h"
#include "cli/validate_op.h"
#include "harness/support/errors.h"
#include "harness/support/phase.h"
#include "harness/support/text.h"
#include "reports/report.h"

namespace ckcheck::cli {
namespace {

bool& verbose() {
  static bool on = false;
  return on;
}

// An absolute path in an error that the user did not give (a library's file, a temporary folder):
// its last component, so the line names what the user knows.
std::string user_paths_only(const std::string& s) {
  std::set<std::string> given;
  std::error_code ec;
  for (const auto& a : command_line()) {
    given.insert(a);
    const auto abs = std::filesystem::weakly_canonical(a, ec);
    if (!ec) given.insert(abs.string());
  }
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const bool starts = s[i] == '/' && (i == 0 || std::string(" '\"([:=").find(s[i - 1]) != std::string::npos);
    if (!starts) {
      out += s[i++];
      continue;
    }
    size_t end = i;
    while (end < s.size() && std::string(" '\"),:\n").find(s[end]) == std::string::npos) ++end;
    const auto path = s.substr(i, end - i);
    const auto slash = path.find_last_of('/');
    bool keep = given.count(path) || path.find('/', 1) == std::string::npos;
    for (const auto& g : given) keep = keep || g.find(path) != std::string::npos;
    out += keep || slash == std::string::npos ? path : path.substr(slash + 1);
    i = end;
  }
  return out;
}

// The error as one line: without c10's "Exception raised from" trailer or a Python traceback
// ("At:" from pybind11, "Traceback (most recent call last)"), and without paths the user did not
// give. --verbose keeps all of it.
std::string one_line(std::string s) {
  if (verbose()) return s;
  for (const char* trailer : {"\nException raised from", "\n\nAt:\n", "\nAt:\n", "\nTraceback (most recent call last)"}) {
    const auto cut = s.find(trailer);
    if (cut != std::string::npos) s = s.substr(0, cut);
  }
  std::replace(s.begin(), s.end(), '\n', ' ');
  return visible(user_paths_only(s));  // an echoed argument or a module's message: no terminal sequence
}

int fail_usage(const std::string& message) {
  std::cerr << "ckcheck: error: " << one_line(message) << "\n";
  return 2;
}

}  // namespace

std::string flag_for_field(const std::string& field) {
  for (const auto& flag : {flag_of(model_option_table(), field), flag_of(run_option_table(), field),
                           flag_of(bench_option_table(), field), flag_of(plan_option_table(), field),
                           flag_of(validate_op_option_table(), field)}) {
    if (!flag.empty()) return flag;
  }
  std::string words = field;
  std::replace(words.begin(), words.end(), '_', '-');
  return "--" + words;  // a built-in model's option, --report
}

namespace {

// A rank the launcher started tells it, through a file of its own, its phase and the exit status
// ckcheck chose (CKCHECK_RANK_STATUS_FILE): a rank that ends otherwise (os._exit, a signal) is told
// apart, with the phase it was in.
void open_rank_status() {
  const char* file = std::getenv("CKCHECK_RANK_STATUS_FILE");
  if (!file || !*file || supervised()) return;
  const int fd = open(file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  set_status_fd(fd);
  tell_started();
}

}  // namespace

// The command line's exit status, with its one line on standard error (run_cli tells it on).
int run_cli_unreported(const std::vector<std::string>& given);

int run_cli(const std::vector<std::string>& given) {
  open_rank_status();
  const int code = run_cli_unreported(given);
  tell_exit(code);
  return code;
}

namespace {

// The arguments without --verbose; --verbose anywhere: errors keep their whole text (a Python
// traceback, c10's trailer).
std::vector<std::string> take_verbose(const std::vector<std::string>& given) {
  std::vector<std::string> args;
  for (const auto& a : given) {
    if (a == "--verbose") {
      verbose() = true;
      setenv("CKCHECK_VERBOSE", "1", 1);  // the Python side adds tracebacks to its errors
    } else {
      args.push_back(a);
    }
  }
  return args;
}

// The one line for a command line CLI11 could not parse.
int parse_error(const CLI::App& app, const CLI::ParseError& e, const std::vector<std::string>& args) {
  const auto subs = app.get_subcommands();
  if (subs.empty() && !args.empty()) {
    std::vector<std::string> names;
    for (const auto* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    return fail_usage(fmt::format("unknown command or option '{}'; commands: {} (see `ckcheck --help`)", args.front(),
                                  fmt::join(names, ", ")));
  }
  const std::string hint = subs.empty() ? "ckcheck --help" : "ckcheck " + subs.front()->get_name() + " --help";
  return fail_usage(std::string(e.what()) + " (see `" + hint + "`)");
}

}  // namespace

int run_cli_unreported(const std::vector<std::string>& given) {
  const std::vector<std::string> args = take_verbose(given);
  CLI::App app{"ckcheck: tells whether gradient checkpointing is correct and worth it for a model, "
               "before the GPU time is spent.\nRun `ckcheck COMMAND --help` for a command's options; "
               "--verbose (anywhere) keeps an error's whole text, a Python traceback included."};
  app.name("ckcheck");
  app.set_version_flag("--version", version_text());
  app.require_subcommand(1, 1);

  set_command_line(args);
  int exit_code = 0;
  setup_run(app, exit_code);
  setup_diagnose(app, exit_code);
  setup_selftest(app, exit_code);
  setup_bench(app, exit_code);
  setup_plan(app, exit_code);
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
    return parse_error(app, e, args);
  } catch (const Interrupted&) {
    // A SIGINT that reached the model's Python code: one line, the signal's status, no report.
    std::cerr << "ckcheck: error: stopped by SIGINT (Interrupt) in " << visible(current_phase())
              << "; no report was written\n";
    return 128 + SIGINT;
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
