#include "cli/diagnose.h"

#include <fmt/format.h>

#include <chrono>
#include <iostream>

#include "analyses/diagnose.h"
#include "analyses/session.h"
#include "cli/supervise.h"
#include "harness/support/errors.h"

namespace ckcheck::cli {

void setup_diagnose(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RunOptions>();
  auto* sub = app.add_subcommand(
      "diagnose",
      "Find where and why checkpointing changes a model's result or where NaN comes from: the "
      "checkpointed sites that change the result (bisection), the first op that differs between "
      "the forward and the recompute, the first op that produced NaN/Inf with and without "
      "checkpointing, the cause and the fix. Takes the same options as `ckcheck run`.\n"
      "Exit status: 0 when nothing diverges, 1 when something does, 2 for bad usage or input.\n"
      "Example: ckcheck diagnose --model transformer --no-preserve-rng");
  add_model_args(*sub, o->model);
  add_run_flags(*sub, *o, select_checks({}));
  add_report_option(*sub, o->reports);
  sub->callback([o, &exit_code] { exit_code = run_diagnose(*o); });
}

int run_diagnose(const RunOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto targets = report_targets(o.reports, {o.model.model, o.model.input_file});
  const auto tolerance = Tolerance::parse(o.tolerance);
  if (o.model.parallel != "off") {
    throw UsageError("diagnose runs in one process; drop --parallel (`ckcheck run --parallel ddp --world-size N` "
                     "checks data-parallel training)");
  }
  CheckpointChoice checkpoint;
  auto model = build_model(o.model, 1, &checkpoint);
  const auto plan = Plan::make(*model, split_list(o.model.sites), Policy::parse(o.model.policy));
  auto config = run_config(o);
  fit_to_checkpoint(config, checkpoint);
  Runner runner(*model, config);
  const auto outcome = run_checks(runner, plan, tolerance, select_checks({}), o.knobs);
  if (!outcome.records.reference.error.empty()) {
    throw UsageError("the model fails without checkpointing, so there is nothing to compare: " +
                     outcome.records.reference.error);
  }
  const auto d = diagnose(runner, plan, tolerance, outcome);

  Report report;
  report.command = "diagnose";
  report.model = model_info(*model, plan, checkpoint, config);
  report.checks = outcome.results;
  report.tensors = outcome.diffs;
  report.verdict = d.diverges || d.non_finite ? Verdict::kFail : Verdict::kPass;
  report.diagnosis = d;
  speak_of_the_checkpoint(checkpoint.name, report);
  report.config = run_report_config(o, plan, config, tolerance, nullptr, select_checks({}), checkpoint);
  auto cmd = run_command_line(o);
  report.reproduce = "ckcheck diagnose" + cmd.substr(std::string("ckcheck run").size());
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  commit_reports(report, targets);
  return report.verdict == Verdict::kPass ? 0 : 1;
}

}  // namespace ckcheck::cli
