#include "cli/selftest.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "analyses/selftest.h"
#include "cli/option_table.h"
#include "cli/supervise.h"
#include "harness/support/errors.h"
#include "harness/support/memory.h"

namespace ckcheck::cli {
namespace {

// The classes asked for (all by default), by name; throws FieldError naming them all otherwise.
std::vector<PlantKind> asked_kinds(const std::vector<std::string>& names) {
  std::vector<PlantKind> kinds;
  std::vector<std::string> known;
  for (const auto& c : plant_classes()) known.push_back(c.name);
  for (const auto& name : split_list(names)) {
    const auto kind = parse_plant_kind(name);
    if (!kind) throw FieldError("plants", fmt::format("@plants: unknown class '{}'; classes: {}", name, fmt::join(known, ", ")));
    if (std::find(kinds.begin(), kinds.end(), *kind) == kinds.end()) kinds.push_back(*kind);
  }
  if (names.empty()) {
    for (const auto& c : plant_classes()) kinds.push_back(c.kind);
  }
  return kinds;
}

std::vector<std::string> failing(const std::vector<CheckResult>& results) {
  std::vector<std::string> out;
  for (const auto& r : results) {
    if (r.status != Status::kFail && r.status != Status::kError) continue;
    std::set<std::string> causes;
    for (const auto& f : r.findings) causes.insert(f.cause.name());
    out.push_back(fmt::format("{} ({})", r.id, fmt::join(causes, ", ")));
  }
  return out;
}

// One planted run: the cell, with what it cost. A plant the run cannot take is that cell's error.
SelftestCell planted_cell(RunSetup& setup, const RunOptions& o, PlantKind kind, const std::string& site) {
  setup.config.plant = std::make_shared<Plant>(kind, site);
  const double cpu0 = process_cpu_seconds();
  SelftestCell cell;
  try {
    Runner runner(*setup.model, setup.config);
    const auto outcome = run_once(setup, runner, o);
    cell = judge_plant(plant_outcome(*setup.config.plant, outcome, setup.config), outcome.results);
  } catch (const UsageError& e) {
    const auto& c = plant_class(kind);
    cell.plant = c.name;
    cell.site = site;
    cell.cause = c.cause;
    cell.outcome = "error";
    cell.note = e.what();
  }
  setup.config.plant = nullptr;
  cell.cpu_seconds = process_cpu_seconds() - cpu0;
  RunOptions planted = o;
  planted.plant = fmt::format("{}@{}", plant_class(kind).name, site);
  cell.reproduce = run_command_line(planted);
  return cell;
}

std::string selftest_command_line(const SelftestOptions& o) {
  std::string s = "ckcheck selftest" + run_command_line(o.run).substr(std::string("ckcheck run").size());
  if (!o.plants.empty()) s += " --plants " + shell_quote(fmt::format("{}", fmt::join(split_list(o.plants), ",")));
  if (o.every_site) s += " --every-site";
  return s;
}

// The selftest's report on rank 0 (or alone); nullopt on the other ranks and in the process that
// started them (`status` gets theirs).
std::optional<Report> selftest_report(const SelftestOptions& o, int& status) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto kinds = asked_kinds(o.plants);
  auto setup = set_up_run(o.run, status);
  if (!setup) return std::nullopt;
  const double cpu0 = process_cpu_seconds();
  SelftestResult result;
  const int world = setup->collective ? setup->collective->world_size() : 1;
  std::vector<PlantKind> live;
  for (const auto kind : kinds) {
    const auto& c = plant_class(kind);
    const auto why_not = plant_not_applicable(kind, setup->config, world);
    result.classes.push_back({c.name, c.cause, c.what, why_not});
    if (why_not.empty()) live.push_back(kind);
  }
  Runner runner(*setup->model, setup->config);
  const auto unplanted = run_once(*setup, runner, o.run);
  result.unplanted = verdict_of(unplanted.results);
  result.unplanted_failing = failing(unplanted.results);
  result.plain_step_seconds = unplanted.cost.plain_step_seconds;
  for (const auto& u : setup->plan.units) result.sites.push_back(u.front());
  for (const auto& [kind, site] : plant_cells(setup->plan, live, o.every_site)) {
    result.cells.push_back(planted_cell(*setup, o.run, kind, site));
  }
  result.cpu_seconds = process_cpu_seconds() - cpu0;
  if (setup->collective && setup->collective->rank() != 0) return std::nullopt;
  Report report;
  report.command = "selftest";
  report.model = model_info(*setup->model, setup->plan, setup->checkpoint, runner.config());
  report.checks = unplanted.results;
  report.selftest = result;
  const bool sound = result.unplanted == Verdict::kPass && result.count("missed") == 0 &&
                     result.count("false-alarm") == 0 && result.count("error") == 0;
  report.verdict = sound ? Verdict::kPass : Verdict::kFail;
  report.reproduce = selftest_command_line(o);
  report.config = run_report_config(o.run, setup->plan, runner.config(), setup->tolerance, setup->collective.get(),
                                    setup->checks, setup->checkpoint);
  speak_of_the_checkpoint(setup->checkpoint.kind, report);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace

void setup_selftest(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<SelftestOptions>();
  std::vector<std::string> names;
  for (const auto& c : plant_classes()) names.push_back(c.name);
  auto* sub = app.add_subcommand(
      "selftest",
      "Plant each class of bug ckcheck claims to catch into your own model and configuration, one at a time "
      "(dropout recomputed without its RNG state, a site input changed in place, state updated twice, autocast "
      "lost in the recompute, a random op recomputed with new numbers, a lost auxiliary gradient, a gradient "
      "hook fired twice, the same mask on every rank), run the checks on each, and print the detection matrix: "
      "caught with the right cause, with another, missed, or dormant (the configuration is immune), with what it "
      "cost. Takes the options of `ckcheck run`.\n"
      "Exit status: 0 when the unplanted model passes and every live plant is caught, 1 when one is missed (or "
      "the unplanted model fails), 2 for bad usage or input.\n"
      "Example: ckcheck selftest --model transformer");
  add_model_args(*sub, o->run.model);
  add_run_flags(*sub, o->run, select_checks({}));
  add_report_option(*sub, o->run.reports);
  sub->add_option("--plants", o->plants, fmt::format("the classes to plant, comma-separated (default: every one this "
                                                     "configuration supports): {}", fmt::join(names, ", ")))
      ->type_name("CLASS[,CLASS]");
  std::vector<std::string> ids;
  for (const auto& c : builtin_checks()) ids.push_back(c->id());
  sub->add_option("--checks", o->run.checks,
                  fmt::format("the checks each run makes, comma-separated (default: those `ckcheck run` makes): {}; a "
                              "class no check left can see is missed",
                              fmt::join(ids, ", ")))
      ->delimiter(',');
  sub->add_flag("--every-site", o->every_site,
                "plant each class at every checkpointed unit (default: class k at unit k, round the units: every unit "
                "and every class once, at about one run per class)");
  sub->callback([o, &exit_code] { exit_code = run_selftest(*o); });
}

int run_selftest(const SelftestOptions& o) {
  const auto targets = report_targets(o.run.reports, {o.run.model.model, o.run.model.input_file});
  int status = 0;
  const auto report = selftest_report(o, status);
  if (!report) return status;
  commit_reports(*report, targets);
  return report->verdict == Verdict::kPass ? 0 : 1;
}

Report selftest_in_process(const SelftestOptions& o) {
  if (o.run.world_size > 1 || rank_environment()) {
    throw FieldError("world_size", "@world_size: a data-parallel selftest starts processes of its own; run it with "
                                   "the ckcheck command (ckcheck selftest --world-size N)");
  }
  if (o.run.timeout > 0) {
    throw FieldError("timeout", "@timeout: a selftest past its deadline ends its process, here the caller's; run it "
                                "with the ckcheck command (ckcheck selftest --timeout S)");
  }
  int status = 0;
  return *selftest_report(o, status);
}

}  // namespace ckcheck::cli
