#include "cli/plan.h"

#include <fmt/format.h>

#include <chrono>

#include "analyses/plan.h"
#include "cli/supervise.h"
#include "harness/support/phase.h"
#include "harness/support/errors.h"
#include "harness/support/text.h"

namespace ckcheck::cli {

const OptionTable<PlanCliOptions>& plan_option_table() {
  static const OptionTable<PlanCliOptions> table = [] {
    using Row = OptionRow<PlanCliOptions>;
    OptionTable<PlanCliOptions> t;
    t.push_back(Row("--memory-budget",
                    "memory the training step may use in all (parameters, gradients and inputs included), as 60MiB or "
                    "8GiB",
                    &PlanCliOptions::memory_budget)
                    .check(non_empty("a memory size, as 8GiB or 512MiB"))
                    .required()
                    .config("memory_budget"));
    t.push_back(Row("--steps", "measured rounds of the plans against none (one step of each per round)", &PlanCliOptions::steps)
                    .check(whole_number(1, 10000))
                    .always()
                    .config("steps"));
    t.push_back(Row("--warmup", "unmeasured steps before them", &PlanCliOptions::warmup)
                    .check(whole_number(0, 1000))
                    .always()
                    .config("warmup"));
    t.push_back(Row("--profile-steps", "plain steps the per-site profile is measured over (after one warm-up step)",
                    &PlanCliOptions::profile_steps)
                    .check(whole_number(1, 1000))
                    .always()
                    .config("profile_steps"));
    t.push_back(Row("--time-budget", "seconds of extra measured rounds allowed while the time intervals are wide",
                    &PlanCliOptions::time_budget)
                    .check(finite_number(0, 86400))
                    .config("time_budget"));
    t.push_back(Row("--tolerance",
                    "when tensors count as equal in the checks each plan must pass before it is recommended (those of "
                    "ckcheck run): bitwise, auto, rtol=R,atol=A or ulp=N",
                    &PlanCliOptions::tolerance)
                    .config("tolerance"));
    t.push_back(Row("--timeout", "the wall-clock limit of the whole command, in seconds (default: none): past it the command stops with one "
                    "line naming the phase it was in, exit status 2, and no report", &PlanCliOptions::timeout)
                    .check(whole_number(1, 86400)));
    t.push_back(Row("--threads",
                    fmt::format("intra-op threads, 1 to {} (four per hardware thread; default: LibTorch's)", max_threads()),
                    &PlanCliOptions::threads)
                    .check(whole_number(1, static_cast<uint64_t>(max_threads()))));
    return t;
  }();
  return table;
}

void setup_plan(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<PlanCliOptions>();
  auto* sub = app.add_subcommand(
      "plan",
      "Find the fastest checkpoint plan whose training step fits a memory budget, and verify it before recommending "
      "it. Each candidate site (--sites, or the model's blocks) is profiled once in a plain step: the activations a "
      "checkpoint there would free, the forward its recompute repeats, and where the step's memory peaks. An exact "
      "dynamic program over the sites finds the plan that recomputes least among those predicted to fit. That plan's "
      "checkpointed step is checked as ckcheck run checks it, and measured interleaved against none: predicted and "
      "measured peak and time side by side. A plan that fails a check is never recommended: the sites its findings "
      "name are set aside and the next plan is solved and verified; one measured over the budget is solved again for "
      "a budget smaller by the excess. The plan is printed as a --policy string that run and bench accept.\n"
      "Exit 0: a plan passes and fits; 1: no plan does.\n"
      "Example: ckcheck plan --model transformer --layers 8 --hidden 256 --heads 8 --seq 128 --batch 8 "
      "--memory-budget 60MiB --report html=plan.html");
  add_model_args(*sub, o->model, /*with_policy=*/false, /*with_steps=*/false);
  add_options(*sub, *o, plan_option_table());
  add_report_option(*sub, o->reports, " (html with a memory-time chart)");
  sub->callback([o, &exit_code] { exit_code = run_plan_command(*o); });
}

int run_plan_command(const PlanCliOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto targets = report_targets(o.reports, {o.model.model, o.model.input_file});
  // The deadline here, or in the ckcheck program that watches this one (a Python model).
  if (o.timeout > 0 && !supervised()) arm_deadline(o.timeout);
  if (o.threads > 0) torch::set_num_threads(o.threads);
  if (o.model.compile) {
    throw UsageError("ckcheck plan profiles module checkpoints of an eager step; under --compile the compiler's own "
                     "budget chooses what to recompute: use ckcheck bench --compile (budget:F policies)");
  }
  PlanOptions options;
  options.memory_budget_bytes = parse_bytes(o.memory_budget);
  options.profile_steps = o.profile_steps;
  options.bench.steps = o.steps;
  options.bench.warmup = o.warmup;
  options.bench.time_budget_s = o.time_budget;
  options.bench.tolerance = Tolerance::parse(o.tolerance);
  options.bench.check_command = "ckcheck run " + model_command_line(o.model, /*with_policy=*/false);

  CheckpointChoice checkpoint;
  auto model = build_model(o.model, 1, &checkpoint);
  if (checkpoint.kind == CheckpointKind::kModel) {
    throw UsageError("ckcheck plan chooses the sites to checkpoint, but the model's own switch checkpoints all its blocks at "
                     "once: plan with --checkpoint torch (torch.utils.checkpoint, what such switches call), then apply the "
                     "plan's sites yourself");
  }
  RunConfig config = run_config(o.model);
  fit_to_checkpoint(config, checkpoint);
  Runner runner(*model, config);
  auto result = make_memory_plan(runner, split_list(o.model.sites), options);

  Report report;
  report.command = "plan";
  report.model.name = model->name();
  report.model.options = model->options();
  report.model.sites = model->sites();
  report.model.candidates.clear();
  for (const auto& s : result.profile.sites) report.model.candidates.push_back(s.site);
  report.model.checkpoint = checkpoint.name();
  report.model.checkpoint_reason = checkpoint.reason;
  report.model.policy = result.recommendation;
  report.verdict = result.fits ? Verdict::kPass : Verdict::kFail;
  report.config = config_options(o, plan_option_table());
  report.config.update({{"seed", o.model.seed}, {"checkpoint", checkpoint.name()}, {"device", config.device.str()},
                        {"amp", amp_name(config.amp)}, {"threads", torch::get_num_threads()}});
  report.reproduce = "ckcheck plan " + model_command_line(o.model, /*with_policy=*/false) + reproduce_options(o, plan_option_table());
  if (result.fits && result.recommendation != "none") {
    auto args = o.model;
    args.policy = result.recommendation;
    report.plan_command = "ckcheck run " + model_command_line(args);
  }
  report.plan = std::move(result);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  commit_reports(report, targets);
  return report.verdict == Verdict::kPass ? 0 : 1;
}

}  // namespace ckcheck::cli
