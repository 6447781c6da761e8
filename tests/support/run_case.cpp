#include "tests/support/run_case.h"

#include <fmt/format.h>

#include "cli/run.h"
#include "fixtures/registry.h"

namespace ckcheck::testing {

const CheckResult& CaseResult::check(const std::string& id) const {
  for (const auto& r : results) {
    if (r.id == id) return r;
  }
  throw std::runtime_error("no check " + id);
}

std::string CaseResult::summary() const {
  std::string s;
  for (const auto& r : results) {
    s += fmt::format("{}={}", r.id, status_name(r.status));
    if (!r.findings.empty()) {
      s += "(";
      for (const auto& f : r.findings) s += fmt::format("{}@{} ", cause_name(f.cause), f.site);
      s.back() = ')';
    }
    s += " ";
  }
  return s;
}

CaseResult run_case(const ModelCase& c, const std::vector<std::string>& flags) {
  auto model = make_model(c.model, c.options, c.seed);
  // The flags mean what they mean to `ckcheck run`: parsed by its own option table.
  cli::RunOptions options;
  CLI::App app;
  cli::add_run_flags(app, options, select_checks({}));
  app.parse(std::vector<std::string>(flags.rbegin(), flags.rend()));
  RunConfig config = cli::run_config(options);
  config.seed = c.seed;
  config.checkpoint.restore_buffers = config.checkpoint.restore_buffers || c.restore_buffers;
  if (c.amp) config.amp = Amp::kBf16;
  const auto plan = Plan::make(*model, {}, Policy::parse(c.policy));
  Runner runner(*model, config);
  auto outcome = run_checks(runner, plan, Tolerance(), select_checks({}));
  return {outcome.results, std::move(outcome.records), plan.units.size()};
}

}  // namespace ckcheck::testing
