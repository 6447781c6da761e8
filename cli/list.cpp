// `ckcheck list`: the built-in models with their options and sites, the policies, the checks and
// the report formats.
#include "cli/list.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>

#include "checks/check.h"
#include "fixtures/registry.h"
#include "harness/runner/plant.h"
#include "reports/report.h"

namespace ckcheck::cli {

void setup_list(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("list", "List the built-in models (options, sites), policies, checks, causes, the bugs selftest plants and report formats");
  sub->callback([&exit_code] { exit_code = run_list(std::cout); });
}

int run_list(std::ostream& out) {
  out << "Models (--model NAME, or --model PATH.pt for a TorchScript file):\n";
  for (const auto& spec : builtin_models()) {
    out << fmt::format("  {:<28} {}\n", spec.name, spec.description);
    std::vector<std::string> opts;
    for (const auto& o : spec.options) opts.push_back(fmt::format("--{} {}", o.name, o.default_value));
    out << fmt::format("  {:<28} options: {}\n", "", fmt::join(opts, ", "));
    auto model = spec.make(ModelConfig(spec, {}, 0));
    const auto sites = model->sites();
    std::vector<std::string> shown(sites.begin(), sites.begin() + std::min<size_t>(sites.size(), 9));
    out << fmt::format("  {:<28} sites: {}{}\n", "", fmt::join(shown, ", "),
                       sites.size() > shown.size() ? fmt::format(", ... ({} in all)", sites.size()) : "");
  }
  out << "\nPolicies (--policy):\n"
         "  none                         nothing checkpointed\n"
         "  every:K                      every K-th candidate site (every:1 = all)\n"
         "  segments[:N]                 N runs of consecutive blocks, all but the last checkpointed\n"
         "                               (N defaults to sqrt of the number of candidates)\n"
         "  sites:GLOB[,GLOB]            the candidate sites (and sites nested in them) matching a glob\n"
         "  budget:F                     (--compile) no module checkpoints: the compiler's activation memory\n"
         "                               budget F, 0 to 1, decides what the compiled backward recomputes\n"
         "  sac:OP[+OP][@GLOB[+GLOB]]    (Python models, torch.utils.checkpoint) every candidate checkpointed (or\n"
         "                               those a glob matches), those ops saved and every other op recomputed\n"
         "                               (as sac:aten.mm+aten.bmm or sac:aten.mm@blocks.0+blocks.1)\n";
  out << "\nChecks (--checks id,id):\n";
  for (const auto& c : builtin_checks()) {
    const auto& info = c->info();
    out << fmt::format("  {:<28} {} [{}{}]\n", c->id(), info.description, check_kind_name(info.kind),
                       info.applies == Applies::kAlways ? "" : ", on request");
    for (const auto& k : info.knobs) {
      out << fmt::format("  {:<28} --{} (default {:g}): {}\n", "", k.name, k.default_value, k.help);
    }
  }
  out << "\nCauses (in findings):\n";
  for (auto c : all_causes()) out << fmt::format("  {:<28} {}\n", cause_name(c), fix_hint(c));
  out << "\nPlanted bugs (ckcheck selftest --plants CLASS,CLASS; ckcheck run --plant CLASS@SITE):\n";
  for (const auto& c : plant_classes()) out << fmt::format("  {:<28} {} (the cause: {})\n", c.name, c.what, c.cause);
  out << "\nReport formats (--report FORMAT[=PATH]): " << fmt::format("{}", fmt::join(report_formats(), ", ")) << "\n";
  return 0;
}

}  // namespace ckcheck::cli
