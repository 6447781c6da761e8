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

namespace {

// The value of --model, if given.
std::string model_arg(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--model" && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind("--model=", 0) == 0) return args[i].substr(8);
  }
  return "";
}

// A Python model runs in the Python that has its packages: `python -m ckcheck` runs this same
// CLI in-process, with the Python model loader of the ckcheck package.
int run_in_python(const std::vector<std::string>& args) {
  const char* configured = std::getenv("CKCHECK_PYTHON");
  const std::string python = configured && *configured ? configured : CKCHECK_PYTHON_EXECUTABLE;
  std::string path = CKCHECK_PYTHON_PACKAGE_DIR;
  if (const char* old = std::getenv("PYTHONPATH"); old && *old) path += std::string(":") + old;
  setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<char*> argv;
  std::vector<std::string> all = {python, "-m", "ckcheck"};
  all.insert(all.end(), args.begin(), args.end());
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(python.c_str(), argv.data());
  std::cerr << "ckcheck: error: cannot start " << python << " for the Python model (" << std::strerror(errno)
            << "); set CKCHECK_PYTHON to the Python that has torch and the ckcheck package\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const bool help = std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "-h" || a == "--help"; });
  if (!help && ckcheck::cli::is_python_model(model_arg(args))) return run_in_python(args);
  return ckcheck::cli::run_cli(args);
}
