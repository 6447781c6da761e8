// ckcheck: is gradient checkpointing correct, and is it worth it, for this model?
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <iostream>

#include "cli/list.h"
#include "cli/run.h"
#include "harness/errors.h"
#include "reports/report.h"

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

int main(int argc, char** argv) {
  CLI::App app{"ckcheck: tells whether gradient checkpointing is correct and worth it for a model, "
               "before the GPU time is spent.\nRun `ckcheck COMMAND --help` for a command's options."};
  app.name("ckcheck");
  app.set_version_flag("--version", "ckcheck " + ckcheck::ckcheck_version());
  app.require_subcommand(1, 1);
  app.fallthrough(false);

  int exit_code = 0;
  ckcheck::cli::setup_run(app, exit_code);
  ckcheck::cli::setup_list(app, exit_code);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string hint = app.get_subcommands().empty() ? "ckcheck --help" : "ckcheck " + app.get_subcommands().front()->get_name() + " --help";
    return fail_usage(std::string(e.what()) + " (see `" + hint + "`)");
  } catch (const ckcheck::UsageError& e) {
    return fail_usage(e.what());
  } catch (const c10::Error& e) {
    return fail_usage(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail_usage(e.what());
  }
  return exit_code;
}
