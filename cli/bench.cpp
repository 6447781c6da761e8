#include "cli/bench.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <iostream>
#include <memory>

#include "analyses/bench.h"
#include "cli/launch.h"
#include "cli/run.h"
#include "cli/supervise.h"
#include "harness/support/phase.h"
#include "harness/runner/data_parallel.h"
#include "harness/support/errors.h"
#include "harness/support/text.h"

namespace ckcheck::cli {

const OptionTable<BenchCliOptions>& bench_option_table() {
  static const OptionTable<BenchCliOptions> table = [] {
    using Row = OptionRow<BenchCliOptions>;
    const auto& knob = max_overhead_knob();
    OptionTable<BenchCliOptions> t;
    t.push_back(Row("--policies",
                    "policies to measure, comma-separated (default: none, every:1, every:2, every:4, segments:sqrt, "
                    "sites:*.attn, sites:*.ffn -- those that apply to the model; with --compile also the compiler's "
                    "memory budgets budget:0, budget:0.25, budget:0.5 and budget:1); for a Python model also op-level "
                    "policies sac:OP[+OP][@GLOB[+GLOB]] (every candidate site, or those the globs match, checkpointed; those ops saved, every other op recomputed)",
                    &BenchCliOptions::policies)
                    .check(non_empty("a policy, as every:2"))
                    .config("policies"));
    t.push_back(Row("--steps", "measured rounds (one step of each policy per round)", &BenchCliOptions::steps)
                    .check(whole_number(1, 10000))
                    .always()
                    .config("steps"));
    t.push_back(Row("--warmup", "unmeasured steps before them", &BenchCliOptions::warmup)
                    .check(whole_number(0, 1000))
                    .always()
                    .config("warmup"));
    t.push_back(Row("--memory-budget", "memory the step may use, as 8GiB or 512MiB: recommend the fastest policy that fits",
                    &BenchCliOptions::memory_budget)
                    .check(non_empty("a memory size, as 8GiB or 512MiB"))
                    .config("memory_budget"));
    t.push_back(Row("--" + knob.name, "warn above this much extra step time (0.5 = +50%; the overhead check's bound)",
                    &BenchCliOptions::max_overhead)
                    .check(finite_number(knob.min, knob.max, knob.min_open))
                    .config("max_overhead"));
    t.push_back(Row("--time-budget",
                    "seconds of extra rounds allowed when a policy measures faster than none beyond the noise (it "
                    "does more work, so the machine is noisy); past it only the memory verdict is given",
                    &BenchCliOptions::time_budget)
                    .check(finite_number(0, 86400))
                    .config("time_budget"));
    t.push_back(Row("--tolerance",
                    "when tensors count as equal in the checks every policy's checkpointed step must pass before it is "
                    "ranked (those of ckcheck run): bitwise, auto, rtol=R,atol=A or ulp=N",
                    &BenchCliOptions::tolerance)
                    .config("tolerance"));
    t.push_back(Row("--world-size",
                    "with --parallel ddp|fsdp: measure memory per rank on N ranks (processes) on this machine, "
                    "meeting on loopback (Gloo); under torchrun each process joins as its rank instead",
                    &BenchCliOptions::world_size)
                    .check(whole_number(1, 256)));
    t.push_back(Row("--timeout",
                    "the wall-clock limit of the whole command in seconds (default: none; with --parallel, 300): past "
                    "it the command stops with one line naming the phase it was in or the rank that did not finish, "
                    "exit status 2, no report",
                    &BenchCliOptions::timeout)
                    .check(whole_number(1, 86400)));
    t.push_back(Row("--threads",
                    fmt::format("intra-op threads, 1 to {} (four per hardware thread; default: LibTorch's)", max_threads()),
                    &BenchCliOptions::threads)
                    .check(whole_number(1, static_cast<uint64_t>(max_threads()))));
    return t;
  }();
  return table;
}

void setup_bench(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<BenchCliOptions>();
  auto* sub = app.add_subcommand(
      "bench",
      "Measure the peak memory (above parameters and gradients) and step time of checkpoint "
      "policies, beside the analytic activation memory, and recommend one: with --memory-budget "
      "the fastest that fits, without it the knee of the memory-time curve. Warns when a policy "
      "costs over 50% time (checkpoints too fine) or when checkpointing saves under 10% (and says "
      "what fills memory instead).\n"
      "Time is measured interleaved: after each policy's warm-up, one step of every policy per round, round "
      "after round, so every policy sees the same load; time x none is the ratio of the means of the fastest 30% of the step "
      "times (other processes only add time) with its 95% interval, more rounds are measured while an interval "
      "is wider than +-3% (up to --time-budget), and policies whose times cannot be told apart are decided on "
      "memory. none is always measured, as the reference.\n"
      "Every policy that checkpoints something is also checked as ckcheck run checks it (its checkpointed step "
      "against the plain one): one that fails is shown, never ranked or recommended. Peaks within 2% of the largest "
      "are one memory class, for which the policy that recomputes least stands (fewest checkpointed sites, then the "
      "order listed): a tie is decided by the plan, never by the clock.\n"
      "Example: ckcheck bench --model transformer --layers 8 --hidden 256 --seq 128 --policies "
      "none,every:1,every:2,every:4 --report html=bench.html");
  add_model_args(*sub, o->model, /*with_policy=*/false, /*with_steps=*/false, /*with_offload=*/true,
                 /*with_parallel=*/true);
  add_options(*sub, *o, bench_option_table());
  add_report_option(*sub, o->reports, " (html with a memory-time chart)");
  sub->callback([o, &exit_code] { exit_code = run_bench_command(*o); });
}

namespace {

// bench --parallel: this process starts the ranks (or, under torchrun, is one); each rank measures
// through the engine and rank 0 reports. Null when this process reports nothing (it started the
// ranks, whose rank 0 reported, with `status` their exit status; or it is another rank).
std::unique_ptr<Collective> per_rank_group(const BenchCliOptions& o, std::unique_ptr<Model>& model,
                                           CheckpointChoice& checkpoint, std::unique_ptr<DataParallel>& dp,
                                           int& status) {
  const auto env = rank_environment();
  const int timeout = o.timeout ? o.timeout : kRankTimeout;
  if (!env) {
    if (o.world_size < 2) {
      throw UsageError(fmt::format("bench --parallel {} measures memory per rank: add --world-size N (2 or more), or "
                                   "start ckcheck under torchrun",
                                   o.model.parallel));
    }
    // The model is checked here, before any rank starts.
    check_batch_splits(*build_model(o.model, o.world_size, &checkpoint), o.model.seed, o.world_size);
    status = launch_ranks(o.world_size, timeout);
    return nullptr;
  }
  guard_rank(env->rank, env->world_size, timeout);
  signal(SIGPIPE, SIG_IGN);  // a peer that dies closes its sockets: an error, not a killed rank
  ModelArgs args = o.model;
  args.parallel_timeout = timeout;
  model = build_model(args, env->world_size, &checkpoint);
  auto* engine = dynamic_cast<ParallelEngine*>(model.get());
  if (!engine || engine->engine() == ParallelKind::kOff) {
    throw UsageError("bench --parallel measures a Python model in PyTorch's engine; this model has none");
  }
  auto group = mark_waits(engine->engine_collective());
  dp = std::make_unique<DataParallel>(*group, *engine);
  return group;
}

}  // namespace

namespace {

// Draws a progress bar on a terminal's standard error while the policies are measured.
void progress_bar(size_t i, size_t n, const std::string& policy) {
  const int width = 24;
  const int done = n ? static_cast<int>(width * i / n) : width;
  std::cerr << fmt::format("\r  measuring [{}{}] {}/{} {:<20}", std::string(done, '#'), std::string(width - done, '.'), i, n, policy);
  if (i == n) std::cerr << "\r" << std::string(70, ' ') << "\r";
  std::cerr.flush();
}

BenchOptions bench_options(const BenchCliOptions& o) {
  BenchOptions options;
  options.policies = split_list(o.policies);
  options.steps = o.steps;
  options.warmup = o.warmup;
  options.max_overhead = o.max_overhead;
  options.time_budget_s = o.time_budget;
  options.tolerance = Tolerance::parse(o.tolerance);
  options.check_command = "ckcheck run " + model_command_line(o.model, /*with_policy=*/false);
  if (!o.memory_budget.empty()) options.memory_budget_bytes = parse_bytes(o.memory_budget);
  if (isatty(STDERR_FILENO) != 0) options.progress = progress_bar;
  return options;
}

// --offload: what the peaks mean with the checkpointing policies' saved activations offloaded.
void note_offload(BenchResult& result, const std::string& offload, bool cuda) {
  if (offload == "off") return;
  result.offload = offload;
  result.offload_note =
      cuda ? "every policy that checkpoints runs with its saved activations offloaded to pinned host memory (none "
             "runs plain): the peaks are device memory, without those copies"
           : "every policy that checkpoints runs with its saved activations offloaded (none runs plain); on the CPU "
             "the copies are taken from the same memory the peaks count, so a peak shows what offloading costs here, "
             "not what it frees -- on a GPU the peak is device memory and the copies live in host memory";
}

// A step that fails for every policy measured nothing: bad input, not a bench.
void require_a_measurement(const BenchResult& result) {
  std::string first_error;
  bool any_measured = false;
  for (const auto& p : result.policies) {
    any_measured = any_measured || !p.measurement.step_seconds.empty() || !p.fits;
    if (first_error.empty() && !p.measurement.error.empty() && p.fits) first_error = p.policy + ": " + p.measurement.error;
  }
  if (!any_measured && !first_error.empty()) {
    throw UsageError("the model's training step fails, so nothing could be measured: " + first_error);
  }
}

Report bench_report(const BenchCliOptions& o, const Model& model, const CheckpointChoice& checkpoint,
                    const RunConfig& config, BenchResult result) {
  Report report;
  report.command = "bench";
  report.model.name = model.name();
  report.model.options = model.options();
  report.model.sites = model.sites();
  report.model.checkpoint = checkpoint.name();
  report.model.checkpoint_reason = checkpoint.reason;
  report.verdict = Verdict::kPass;
  report.bench = std::move(result);
  // The rows' values, and what the run made of the others.
  report.config = config_options(o, bench_option_table());
  report.config.update({{"seed", o.model.seed}, {"checkpoint", checkpoint.name()}, {"device", config.device.str()}, {"amp", amp_name(config.amp)},
                        {"threads", torch::get_num_threads()}});
  report.reproduce = "ckcheck bench " + model_command_line(o.model, /*with_policy=*/false) + reproduce_options(o, bench_option_table());
  return report;
}

}  // namespace

int run_bench_command(const BenchCliOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.model.parallel_kind() == ParallelKind::kOff && o.world_size > 1) {
    throw UsageError("--world-size applies to bench --parallel ddp|fsdp (memory per rank); add --parallel or drop it");
  }
  const auto targets = report_targets(o.reports, {o.model.model, o.model.input_file});
  // One process: the deadline here, or in the ckcheck program that watches this one (a Python model).
  if (o.model.parallel_kind() == ParallelKind::kOff && o.timeout > 0 && !supervised()) arm_deadline(o.timeout);
  if (o.threads > 0) torch::set_num_threads(o.threads);
  const BenchOptions options = bench_options(o);
  CheckpointChoice checkpoint;
  std::unique_ptr<Model> model;
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<Collective> group;
  if (o.model.parallel_kind() != ParallelKind::kOff) {
    int status = 0;
    group = per_rank_group(o, model, checkpoint, dp, status);
    if (!group) return status;
  } else {
    model = build_model(o.model, 1, &checkpoint);
  }
  RunConfig config = run_config(o.model);
  fit_to_checkpoint(config, checkpoint);
  if (dp && config.device.is_cuda()) {
    throw UsageError(fmt::format("--parallel {} runs on the CPU (Gloo) in this version; drop --device or --parallel",
                                 o.model.parallel));
  }
  config.data_parallel = dp.get();
  Runner runner(*model, config);
  auto result = group ? run_bench_per_rank(runner, split_list(o.model.sites), options, *group)
                      : run_bench(runner, split_list(o.model.sites), options);
  if (group && group->rank() != 0) return 0;  // rank 0 reports
  note_offload(result, o.model.offload, config.device.is_cuda());
  require_a_measurement(result);
  auto report = bench_report(o, *model, checkpoint, config, std::move(result));
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  commit_reports(report, targets);
  return 0;
}

}  // namespace ckcheck::cli
