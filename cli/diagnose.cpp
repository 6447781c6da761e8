#include "cli/diagnose.h"

namespace ckcheck::cli {

void setup_diagnose(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RunOptions>();
  auto* sub = app.add_subcommand(
      "diagnose",
      "Find where and why checkpointing changes a model's result or where NaN comes from: the "
      "checkpointed sites that change the result (bisection), the first op that differs between "
      "the forward and the recompute, the first op that produced NaN/Inf with and without "
      "checkpointing, the cause and the fix. Takes the same options as `ckcheck run`; with --world-size N (and "
      "--parallel ddp|fsdp for a Python model) every rank runs the diagnosis's steps in lockstep and rank 0 "
      "reports.\n"
      "Exit status: 0 when nothing diverges, 1 when something does, 2 for bad usage or input.\n"
      "Example: ckcheck diagnose --model transformer --no-preserve-rng");
  add_model_args(*sub, o->model);
  add_run_flags(*sub, *o, select_checks({}));
  add_report_option(*sub, o->reports);
  sub->callback([o, &exit_code] { exit_code = run_diagnose(*o); });
}

int run_diagnose(const RunOptions& o) { return run_and_report(o, "diagnose"); }

}  // namespace ckcheck::cli
