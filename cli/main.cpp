// ckcheck: is gradient checkpointing correct, and is it worth it, for this model?
#include "cli/app.h"

int main(int argc, char** argv) {
  return ckcheck::cli::run_cli(std::vector<std::string>(argv + 1, argv + argc));
}
