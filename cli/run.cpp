#include "cli/run.h"

#include "analyses/selftest.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <iostream>
#include <optional>

#include "cli/launch.h"
#include "cli/option_table.h"
#include "analyses/diagnose.h"
#include "analyses/session.h"
#include "harness/runner/data_parallel.h"
#include "cli/supervise.h"
#include "harness/support/errors.h"
#include "harness/support/phase.h"

namespace ckcheck::cli {

namespace {

// The rows diagnose shares: how tensors are compared and what the checkpoint protects.
OptionTable<RunOptions> shared_run_rows() {
  using Row = OptionRow<RunOptions>;
  OptionTable<RunOptions> t;
  t.push_back(Row("--tolerance", "when tensors count as equal: bitwise, auto (within the plain step's own noise, measured by rerunning it), "
                  "rtol=R,atol=A or ulp=N", &RunOptions::tolerance)
                  .shared());
  t.push_back(Row("--no-preserve-rng", "do not replay the RNG state in the recompute (shows what dropout does without it)",
                  &RunOptions::no_preserve_rng)
                  .shared());
  t.push_back(Row("--no-restore-autocast", "run the recompute without the forward's autocast state",
                  &RunOptions::no_restore_autocast)
                  .shared());
  t.push_back(Row("--no-check-inputs",
                  "let the checkpoint go on when a segment's input was changed in place (as torch.utils.checkpoint "
                  "does, silently)",
                  &RunOptions::no_check_inputs)
                  .shared());
  t.push_back(Row("--restore-buffers",
                  "restore each checkpointed site's buffers after its recompute (BatchNorm statistics updated once)",
                  &RunOptions::restore_buffers)
                  .shared());
  t.push_back(Row("--recompute-fp32",
                  "keep the recompute in fp32 under --amp (the usual mitigation; measured by the autocast check "
                  "either way)",
                  &RunOptions::recompute_fp32)
                  .shared());
  t.push_back(Row("--probe-every-unit",
                  "run the determinism probe (each unit run again from its forward's inputs and state) on every "
                  "checkpointed unit; by default only on a unit whose recompute did not reproduce its forward "
                  "bitwise, since the recompute is that second run (use it where an op's result varies only now "
                  "and then, as atomics on a GPU)",
                  &RunOptions::config, &RunConfig::probe_every_unit)
                  .config("probe_every_unit")
                  .shared());
  t.push_back(Row("--lr", "learning rate of the SGD update between steps", &RunOptions::config, &RunConfig::lr)
                  .check(finite_number(0, 1e6))
                  .config("lr")
                  .shared());
  return t;
}

}  // namespace

constexpr const char* kPoisonHelp =
    "after each micro-batch's forward, until its backward ended, overwrite with NaN the state a checkpointed unit read "
    "that the model's forward had rewritten before it (a workspace, a buffer the program refills): a recompute or "
    "backward that reads it fails, naming it (a diagnostic: the checkpointed step sees NaN there)";

constexpr const char* kScheduleHelp =
    "the order of the micro-batches in a step, plain and checkpointed alike: sequential (each forward, then its "
    "backward), interleaved (every forward, then the backwards in the same order, as pipeline schedules and "
    "multi-forward losses run them) or reversed (the backwards last to first); other than sequential, 2 micro-batches "
    "unless --accumulate says more. A recompute then runs after the next micro-batch's forward: state that forward "
    "changes is read again";

const OptionTable<RunOptions>& run_option_table() {
  static const OptionTable<RunOptions> table = [] {
    std::vector<std::string> ids;
    for (const auto& c : builtin_checks()) ids.push_back(c->id());
    using Row = OptionRow<RunOptions>;
    OptionTable<RunOptions> t = shared_run_rows();
    t.push_back(Row("--checks",
                    fmt::format("checks to run, comma-separated (default: all but memory and overhead, which --bench "
                                "adds): {}",
                                fmt::join(ids, ", ")),
                    &RunOptions::checks));
    t.push_back(Row("--diagnose", "when a check fails, diagnose the divergence (as `ckcheck diagnose`) and add it to the reports",
                    &RunOptions::diagnose));
    t.push_back(Row("--bench",
                    "also measure memory and time of the plain and checkpointed step, adding the memory and overhead "
                    "checks",
                    &RunOptions::bench)
                    .config("bench"));
    t.push_back(Row("--world-size",
                    "run data-parallel on N ranks (processes) on this machine, meeting through a c10d store on "
                    "loopback: Gloo for CPU tensors, NCCL for CUDA ones; under torchrun (RANK, WORLD_SIZE, "
                    "MASTER_ADDR, MASTER_PORT set) each process joins as its rank instead",
                    &RunOptions::world_size)
                    .check(whole_number(1, 256))
                    .shared());
    t.push_back(Row("--timeout",
                    "the wall-clock limit of the run, in seconds (default: none for one process, 300 for a "
                    "data-parallel run): past it the run stops with one line naming the phase it was in (the "
                    "factory, the plain or the checkpointed step, ...) or the rank that did not finish, exit status "
                    "2, and no report",
                    &RunOptions::timeout)
                    .check(whole_number(1, 86400))
                    .shared());
    t.push_back(Row("--accumulate",
                    "gradient accumulation: N micro-batches per step (inputs of seeds SEED..SEED+N-1), each with its "
                    "forward and backward, gradients summed; adds the gradient-accumulation check (the sums equal, "
                    "bitwise, and every gradient hook fires once per micro-batch)",
                    &RunOptions::config, &RunConfig::accumulate)
                    .check(whole_number(1, 64))
                    .config("accumulate"));
    t.push_back(Row("--poison", kPoisonHelp, &RunOptions::config, &RunConfig::poison_rewritten).config("poison"));
    t.push_back(Row("--schedule", kScheduleHelp, &RunOptions::schedule)
                    .check(CLI::IsMember({"sequential", "interleaved", "reversed"}))
                    .config("schedule"));
    return t;
  }();
  return table;
}

namespace {

// The rows (all, or those diagnose shares), then each check's knobs with the default and range
// the check declares.
void add_run_options(CLI::App& app, RunOptions& o, const std::vector<std::unique_ptr<Check>>& checks, bool all) {
  add_options<RunOptions>(app, o, run_option_table(), [all](const auto& row) { return all || row.is_shared(); });
  for (const auto& c : checks) {
    for (const auto& k : c->info().knobs) {
      o.knobs[k.name] = k.default_value;
      app.add_option("--" + k.name, o.knobs[k.name], fmt::format("{} (the {} check)", k.help, c->id()))
          ->capture_default_str()
          ->check(finite_number(k.min, k.max, k.min_open));
    }
  }
}

}  // namespace

void add_run_flags(CLI::App& app, RunOptions& o, const std::vector<std::unique_ptr<Check>>& checks) {
  add_run_options(app, o, checks, /*all=*/false);
}

RunConfig run_config(const RunOptions& o) {
  RunConfig c = o.config;
  const RunConfig model = run_config(o.model);
  c.seed = model.seed;
  c.steps = model.steps;
  c.device = model.device;
  c.amp = model.amp;
  c.input_requires_grad = model.input_requires_grad;
  c.checkpoint.preserve_rng_state = !o.no_preserve_rng;
  c.checkpoint.restore_autocast = !o.no_restore_autocast;
  c.checkpoint.check_input_versions = !o.no_check_inputs;
  c.checkpoint.restore_buffers = o.restore_buffers;
  c.checkpoint.recompute_fp32 = o.recompute_fp32;
  c.schedule = parse_schedule(o.schedule);
  if (c.schedule != Schedule::kSequential) c.accumulate = std::max<int64_t>(c.accumulate, 2);
  return c;
}

void setup_run(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RunOptions>();
  auto* sub = app.add_subcommand(
      "run",
      "Run training steps plainly and checkpointed from the same state, seed and inputs, and "
      "check that checkpointing changes nothing: gradients, buffers, and each hazard (in-place "
      "inputs, dropout RNG, autocast, non-deterministic or stateful ops, NaN).\n"
      "Exit status: 0 when every check passes (warnings allowed), 1 when one fails, 2 for bad "
      "usage or input.\n"
      "Example: ckcheck run --model transformer --layers 4 --policy every:1 --report json=r.json");
  add_model_args(*sub, o->model);
  add_run_options(*sub, *o, builtin_checks(), /*all=*/true);
  add_report_option(*sub, o->reports);
  sub->add_option("--baseline", o->baseline,
                  "a baseline FILE (from --export, or a JSON report): exit 1 when the verdict, a check's status or "
                  "its causes changed against it, 0 when none did (a failure that stays the same passes); the "
                  "changes are printed under the verdict")
      ->type_name("FILE")
      ->check(CLI::ExistingFile);
  sub->add_option("--plant", o->plant,
                  "plant a bug of class CLASS into site SITE (CLASS@SITE), in the plain and the checkpointed step "
                  "alike, to see what the checks say of it: what `ckcheck selftest` does for each class (`ckcheck "
                  "list` names the classes)")
      ->type_name("CLASS@SITE");
  sub->add_option("--export", o->export_to,
                  "write this run's baseline to FILE (its verdict, and each check's status and causes; the same as "
                  "--report baseline=FILE), for a later --baseline FILE")
      ->type_name("FILE");
  sub->callback([o, &exit_code] { exit_code = run_run(*o); });
}

std::string run_command_line(const RunOptions& o) {
  std::string s = "ckcheck run " + model_command_line(o.model);
  s += reproduce_options(o, run_option_table());
  for (const auto& [name, value] : o.knobs) {
    if (value != find_knob(name).default_value) s += fmt::format(" --{} {}", name, value);
  }
  if (!o.plant.empty()) s += " --plant " + shell_quote(o.plant);
  return s;
}

namespace {

// A cause's default fix names what ckcheck's own checkpoint offers (--restore-buffers,
// is_recomputing(), its handling of inputs without grad). Under PyTorch's checkpoint -- asked for,
// or the one the model's own switch calls -- the fix is what a torch user can do.
std::optional<std::string> torch_user_hint(const Cause& cause) {
  if (cause == Cause::kBufferUpdate) {
    return std::string(
        "torch.utils.checkpoint runs the module's forward again, so its running statistics are updated twice: "
        "keep BatchNorm-style modules outside the checkpointed segments (checkpoint the blocks between them), "
        "or run them in eval mode while training with frozen statistics");
  }
  if (cause == Cause::kStateful) {
    return std::string(
        "torch.utils.checkpoint runs the module again in the recompute and has no recompute flag to skip its "
        "state update: exclude the stateful module from checkpointing, or make its update depend only on the "
        "step (not on how often it is called)");
  }
  if (cause == Cause::kMissingGrad) {
    return std::string(
        "use torch.utils.checkpoint with use_reentrant=False, or make the segment's input require grad "
        "(Hugging Face: model.enable_input_require_grads())");
  }
  if (cause == Cause::kRng) {
    return std::string(
        "keep RNG state: torch.utils.checkpoint with preserve_rng_state=True (its default), and draw random "
        "numbers from the default generator, not a torch.Generator of your own");
  }
  return std::nullopt;
}

}  // namespace

void speak_of_the_checkpoint(CheckpointKind checkpoint, Report& report) {
  if (checkpoint == CheckpointKind::kCkcheck) return;
  // A check's own hint (one that is not its cause's default) already speaks of the case.
  auto rewrite = [](const Cause& cause, std::string& hint) {
    if (hint != fix_hint(cause)) return;
    if (auto torch_hint = torch_user_hint(cause)) hint = *torch_hint;
  };
  for (auto& r : report.checks) {
    for (auto& f : r.findings) rewrite(f.cause, f.hint);
  }
  if (report.diagnosis) {
    for (auto& s : report.diagnosis->sites) rewrite(s.cause, s.hint);
  }
}

namespace {

// Starts the ranks of a data-parallel run from this process, after the checks that need no rank.
int launch(const RunOptions& o, Model& model, const RunConfig& config) {
  if (o.bench) throw UsageError("--bench runs in one process; drop --world-size for it (`ckcheck bench --parallel` measures per rank)");
  check_batch_splits(model, o.model.seed, o.world_size);
  if (config.device.is_cuda() && o.world_size > static_cast<int>(torch::cuda::device_count())) {
    throw UsageError(fmt::format("NCCL needs a GPU per rank: this machine has {} for --world-size {}",
                                 torch::cuda::device_count(), o.world_size));
  }
  return launch_ranks(o.world_size, o.timeout ? o.timeout : kRankTimeout);
}

// This process as one rank (guarded by the run's limit already): joins ckcheck's process group;
// the step's data parallelism goes through it.
std::unique_ptr<Collective> join(const RankEnvironment& env, const RunOptions& o, RunConfig& config) {
  if (config.device.is_cuda()) config.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  return mark_waits(join_process_group(env.rank, env.world_size, env.master_addr, env.master_port, !env.agent_store, config.device,
                                        o.timeout ? o.timeout : kRankTimeout));
}

}  // namespace

nlohmann::json run_report_config(const RunOptions& o, const Plan& plan, const RunConfig& config, const Tolerance& tolerance,
                           const Collective* collective, const std::vector<std::unique_ptr<Check>>& checks,
                           const CheckpointChoice& checkpoint) {
  std::vector<std::string> ids;
  for (const auto& c : checks) ids.push_back(c->id());
  nlohmann::json j = config_options(o.model, model_option_table());
  j.update(config_options(o, run_option_table()));
  j.update({{"checkpoint", checkpoint.name()},
            {"checkpoint_reason", checkpoint.reason},
            {"policy", plan.policy.text()},
            {"device", config.device.str()},
            {"amp", amp_name(config.amp)},
            {"accumulate", config.accumulate},  // the micro-batches run (a schedule runs at least 2)
            {"tolerance", tolerance.text()},
            {"preserve_rng_state", config.checkpoint.preserve_rng_state},
            {"restore_autocast", config.checkpoint.restore_autocast},
            {"check_input_versions", config.checkpoint.check_input_versions},
            {"restore_buffers", config.checkpoint.restore_buffers},
            {"recompute_fp32", config.checkpoint.recompute_fp32},
            {"world_size", collective ? collective->world_size() : 1},
            {"backend", collective ? collective->backend() : "none"},
            {"checks", ids}});
  // Every knob's value, given or default, as NAME_WITH_UNDERSCORES.
  for (const auto& [name, value] : o.knobs) {
    std::string key = name;
    std::replace(key.begin(), key.end(), '-', '_');
    j[key] = value;
  }
  return j;
}

RunOptions default_run_options() {
  RunOptions o;
  for (const auto& c : builtin_checks()) {
    for (const auto& k : c->info().knobs) o.knobs[k.name] = k.default_value;
  }
  return o;
}

// What the options add to a run, which the checks that apply only then look for.
Situation situation_of(const RunOptions& o) {
  Situation situation;
  situation.bench = o.bench;
  situation.accumulation = o.config.accumulate > 1 || o.schedule != "sequential";
  situation.compile = o.model.compile;
  situation.offload = o.model.offload != "off";
  return situation;
}

// Micro-batches (--accumulate, or a --schedule's) and --poison run in one process; --poison
// watches the sequential schedule.
void refuse_ranks_with_micro_batches(const RunOptions& o, const RunConfig& config, bool ranked) {
  const bool ranks = o.world_size > 1 || ranked;
  if ((config.accumulate > 1 || config.poison_rewritten) && ranks) {
    throw UsageError(fmt::format("--{} runs in one process; drop --world-size (or torchrun) for it",
                                 o.config.accumulate > 1 ? "accumulate" : config.poison_rewritten ? "poison" : "schedule"));
  }
  if (config.poison_rewritten && config.schedule != Schedule::kSequential) {
    throw UsageError("--poison overwrites state between each forward and its own backward: drop --schedule for it");
  }
}

std::optional<RunSetup> set_up_run(const RunOptions& o, int& status) {
  RunSetup r;
  r.tolerance = Tolerance::parse(o.tolerance);
  r.checks = select_checks(split_list(o.checks), situation_of(o));
  // Data-parallel: start the ranks here, or be one of them.
  r.env = rank_environment();
  const auto& env = r.env;
  // One process: the deadline here, or in the ckcheck program that watches this one (a Python model).
  if (o.timeout > 0 && !env && o.world_size == 1 && !supervised()) arm_deadline(o.timeout);
  const int rank_timeout = o.timeout ? o.timeout : kRankTimeout;
  // A rank keeps to the run's limit from the start: a Python model joins its engine's process
  // group while it is built.
  if (env && env->world_size > 1) {
    guard_rank(env->rank, env->world_size, rank_timeout);
    // A peer that dies closes its sockets: let writes to them fail as errors, not kill this rank.
    signal(SIGPIPE, SIG_IGN);
  }
  ModelArgs model_args = o.model;
  model_args.parallel_timeout = rank_timeout;
  r.model = build_model(model_args, env ? env->world_size : o.world_size, &r.checkpoint);
  r.plan = Plan::make(*r.model, split_list(o.model.sites), Policy::parse(o.model.policy));
  r.config = run_config(o);
  fit_to_checkpoint(r.config, r.checkpoint);
  refuse_ranks_with_micro_batches(o, r.config, env.has_value());
  if (!env && o.world_size > 1) {
    status = launch(o, *r.model, r.config);
    return std::nullopt;
  }
  if (env && env->world_size > 1) {
    auto* engine = dynamic_cast<ParallelEngine*>(r.model.get());
    if (engine && engine->engine() != ParallelKind::kOff) {
      if (r.config.device.is_cuda()) {
        throw UsageError(fmt::format("--parallel {} runs on the CPU (Gloo) in this version; drop --device or --parallel",
                                     parallel_kind_name(engine->engine())));
      }
      // PyTorch's engine reduces; its process group gathers what the ranks saw.
      r.collective = mark_waits(engine->engine_collective());
      r.dp = std::make_unique<DataParallel>(*r.collective, *engine);
    } else {
      r.collective = join(*env, o, r.config);
      r.dp = std::make_unique<DataParallel>(*r.collective);
    }
    r.config.data_parallel = r.dp.get();
  }
  int64_t numel = 0;
  for (const auto& [name, p] : r.model->named_parameters()) numel += p.numel();
  r.identity = fmt::format("model {} ({} parameters, {} values) under the {} checkpoint, policy {} ({})",
                           r.model->name(), r.model->named_parameters().size(), numel, r.checkpoint.name(),
                           r.plan.policy.text(), fmt::join(r.plan.checkpointed(), " "));
  return r;
}

RunOutcome run_once(RunSetup& setup, Runner& runner, const RunOptions& o) {
  auto outcome = run_checks(runner, setup.plan, setup.tolerance, setup.checks, o.knobs, [&](RunRecords& records) {
    gather_ranks(setup.collective.get(), records, setup.identity);
  });
  if (!outcome.records.reference.error.empty()) {
    throw UsageError("the model fails without checkpointing, so there is nothing to compare: " +
                     outcome.records.reference.error);
  }
  return outcome;
}

namespace {

// The run's report, or nullopt where this process does not report: it started the ranks of a
// data-parallel run (`status` gets theirs) or is a rank other than 0. `command` is "run" or
// "diagnose" (which diagnoses whatever the checks found, and whose verdict is the diagnosis's).
std::optional<Report> run_report(const RunOptions& o, const std::string& command, int& status) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool diagnosing = command == "diagnose";
  auto setup = set_up_run(o, status);
  if (!setup) return std::nullopt;
  if (!o.plant.empty()) setup->config.plant = make_plant(o.plant, *setup->model);
  auto& model = setup->model;
  const auto& plan = setup->plan;
  const auto& tolerance = setup->tolerance;
  const auto& collective = setup->collective;
  const auto& dp = setup->dp;
  Runner runner(*model, setup->config);
  const auto outcome = run_once(*setup, runner, o);
  // Every rank runs the diagnosis's steps; under run --diagnose, whether there is one is rank 0's
  // verdict.
  bool diagnose_it = diagnosing || (o.diagnose && verdict_of(outcome.results) != Verdict::kPass);
  if (dp && o.diagnose && !diagnosing) diagnose_it = dp->rank0(diagnose_it ? "1" : "0") == "1";
  std::optional<Diagnosis> diagnosis;
  if (diagnose_it) diagnosis = diagnose(runner, plan, tolerance, outcome);
  // Only rank 0 reports; the others are done once they have said what they saw.
  if (collective && collective->rank() != 0) return std::nullopt;
  Report report;
  report.command = command;
  report.model = model_info(*model, plan, setup->checkpoint, runner.config());
  report.checks = outcome.results;
  report.tensors = outcome.diffs;
  report.diagnosis = diagnosis;
  if (setup->config.plant) report.plant = plant_outcome(*setup->config.plant, outcome, setup->config);
  if (diagnosing) {
    report.verdict = diagnosis->diverges || diagnosis->non_finite ? Verdict::kFail : Verdict::kPass;
    report.reproduce = "ckcheck diagnose" + run_command_line(o).substr(std::string("ckcheck run").size());
  } else {
    report.cost = outcome.cost;
    report.verdict = verdict_of(report.checks);
    report.reproduce = run_command_line(o);
  }
  report.config = run_report_config(o, plan, runner.config(), tolerance, collective.get(), setup->checks, setup->checkpoint);
  speak_of_the_checkpoint(setup->checkpoint.kind, report);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace

Report run_in_process(const RunOptions& o) {
  if (o.world_size > 1 || rank_environment()) {
    throw FieldError("world_size", "@world_size: a data-parallel run starts processes of its own; run it with "
                                   "the ckcheck command (ckcheck run --world-size N)");
  }
  if (o.timeout > 0) {
    throw FieldError("timeout", "@timeout: a run past its deadline ends its process, here the caller's; run it "
                                "with the ckcheck command (ckcheck run --timeout S), which watches a child process");
  }
  int status = 0;
  return *run_report(o, "run", status);
}

int run_and_report(const RunOptions& o, const std::string& command) {
  // The report targets and the baseline are checked before any work is done.
  auto reports = o.reports;
  if (!o.export_to.empty()) reports.push_back("baseline=" + o.export_to);
  const auto targets = report_targets(reports, {o.model.model, o.model.input_file, o.baseline});
  const auto baseline = o.baseline.empty() ? std::nullopt : std::optional<nlohmann::json>(read_baseline(o.baseline));
  int status = 0;
  auto report = run_report(o, command, status);
  if (!report) return status;
  if (baseline) report->baseline = BaselineComparison{o.baseline, baseline_changes(*baseline, *report)};
  commit_reports(*report, targets);
  if (report->baseline) return report->baseline->changes.empty() ? 0 : 1;
  return report->verdict == Verdict::kPass ? 0 : 1;
}

int run_run(const RunOptions& o) { return run_and_report(o, "run"); }

}  // namespace ckcheck::cli
