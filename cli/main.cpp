// ckcheck: is gradient checkpointing correct, and is it worth it, for this model?
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli/app.h"
#include "cli/common.h"
#include "cli/supervise.h"

namespace {

// The value of --model, if given.
std::string model_arg(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--model" && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind("--model=", 0) == 0) return args[i].substr(8);
  }
  return "";
}

// A Python model runs in the Python that has its packages, in a child process this one watches
// (cli/supervise.h): the ckcheck package runs this same CLI there, with its Python model loader.
int run_in_python(const std::vector<std::string>& args) {
  const char* configured = std::getenv("CKCHECK_PYTHON");
  const std::string python = configured && *configured ? configured : CKCHECK_PYTHON_EXECUTABLE;
  // The package beside this build; an installed ckcheck (its `ckcheck` command) names its own,
  // or none ("") where the Python finds it by itself.
  const char* package = std::getenv("CKCHECK_PYTHON_PACKAGE_DIR");
  std::string path = package ? package : CKCHECK_PYTHON_PACKAGE_DIR;
  if (const char* old = std::getenv("PYTHONPATH"); old && *old) path += (path.empty() ? "" : ":") + std::string(old);
  if (!path.empty()) setenv("PYTHONPATH", path.c_str(), 1);
  // The Python side reads its environment once, at start: --verbose must be there before.
  if (std::find(args.begin(), args.end(), "--verbose") != args.end()) setenv("CKCHECK_VERBOSE", "1", 1);
  return ckcheck::cli::run_python_child(python, args);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const bool help = std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "-h" || a == "--help"; });
  // validate-op --import MODULE: the op is registered by Python code.
  const bool imports = !args.empty() && args[0] == "validate-op" &&
                       std::any_of(args.begin(), args.end(), [](const std::string& a) {
                         return a == "--import" || a.rfind("--import=", 0) == 0;
                       });
  if (!help && (imports || ckcheck::cli::is_python_model(model_arg(args)))) return run_in_python(args);
  return ckcheck::cli::run_cli(args);
}
