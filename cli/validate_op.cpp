#include "cli/validate_op.h"

#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <map>

#include "cli/common.h"
#include "analyses/validate_op.h"
#include "cli/supervise.h"
#include "harness/support/phase.h"
#include "harness/support/errors.h"

namespace ckcheck::cli {

const OptionTable<ValidateOpOptions>& validate_op_option_table() {
  static const OptionTable<ValidateOpOptions> table = [] {
    using Row = OptionRow<ValidateOpOptions>;
    OptionTable<ValidateOpOptions> t;
    t.push_back(Row("--library", "the shared library that registers the op (loaded with dlopen)", &ValidateOpOptions::library)
                    .config("library"));
    t.push_back(Row("--import",
                    "a Python module that registers the op (torch.library.custom_op, Library.define/impl, a Triton "
                    "kernel wrapped as an op), imported in the venv's Python before the op is looked up",
                    &ValidateOpOptions::import_module)
                    .config("import"));
    t.push_back(Row("--op", "the op, as namespace::name or namespace::name.overload", &ValidateOpOptions::op)
                    .required()
                    .always()
                    .config("op"));
    t.push_back(Row("--shapes", "one shape per tensor argument, as 4x16,4x16 (default: generated)", &ValidateOpOptions::shapes)
                    .check(non_empty("a shape per tensor argument, as 4x16,4x16, or leave --shapes out"))
                    .config("shapes"));
    t.push_back(Row("--dtype", "dtype of the tensor arguments: float32, float64, bfloat16, int64", &ValidateOpOptions::dtype)
                    .always()
                    .config("dtype"));
    t.push_back(Row("--timeout", "the wall-clock limit of the whole command, in seconds (default: none): past it the command stops with one "
                    "line naming the phase it was in, exit status 2, and no report", &ValidateOpOptions::timeout)
                    .check(whole_number(1, 86400)));
    t.push_back(Row("--seed", "seed of the generated cases (0 to 2^64-1)", &ValidateOpOptions::seed)
                    .check(whole_number(0, UINT64_MAX))
                    .always()
                    .config("seed"));
    t.push_back(Row("--cases", "generated input cases, 1 to 10000", &ValidateOpOptions::cases)
                    .check(whole_number(1, 10000))
                    .always()
                    .config("cases"));
    return t;
  }();
  return table;
}

void setup_validate_op(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ValidateOpOptions>();
  auto* sub = app.add_subcommand(
      "validate-op",
      "Judge whether a custom op (registered with TORCH_LIBRARY) is safe to recompute under a "
      "checkpoint: deterministic, changes no input its schema does not mark as mutable, draws "
      "random numbers only as a restored generator replays them, behaves the same with grad mode "
      "on and off under autocast, and gives the same gradient checkpointed as plain.\n"
      "An op registered from Python (torch.library) is checked the same way: --import names the module "
      "that registers it.\n"
      "Exit status: 0 safe, 1 unsafe, 2 for bad usage or input.\n"
      "Example: ckcheck validate-op --library build/libmyops.so --op myops::fused_gelu --shapes 4x16\n"
      "Example: ckcheck validate-op --import mypkg.ops --op mylib::fused --shapes 4x16");
  add_options(*sub, *o, validate_op_option_table());
  add_report_option(*sub, o->reports);
  sub->callback([o, &exit_code] { exit_code = run_validate_op(*o); });
}

namespace {
PythonImporter& python_importer() {
  static PythonImporter importer;
  return importer;
}
}  // namespace

void set_python_importer(PythonImporter importer) { python_importer() = std::move(importer); }

Report validate_op_report(const ValidateOpOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  static const std::map<std::string, c10::ScalarType> dtypes = {
      {"float32", c10::kFloat}, {"float64", c10::kDouble}, {"bfloat16", c10::kBFloat16}, {"int64", c10::kLong}};
  const auto dt = dtypes.find(o.dtype);
  if (dt == dtypes.end()) throw UsageError("--dtype '" + o.dtype + "'; valid: float32, float64, bfloat16, int64");
  if (!o.import_module.empty()) {
    // The ckcheck program hands a run with --import to its Python (cli/main.cpp); only there is
    // an importer set.
    if (!python_importer()) throw UsageError("--import needs Python: run it as `ckcheck validate-op --import ...`");
    python_importer()(o.import_module);
  }
  OpValidationOptions options;
  options.library = o.library;
  options.op = o.op;
  if (!o.shapes.empty()) options.shapes = parse_shapes(o.shapes);
  options.dtype = dt->second;
  options.seed = o.seed;
  options.cases = o.cases;
  const auto v = validate_op(options);

  Report report;
  report.command = "validate-op";
  report.model.name = v.op;
  report.checks = v.checks;
  report.verdict = v.safe ? Verdict::kPass : Verdict::kFail;
  report.validation = v;
  report.config = config_options(o, validate_op_option_table());
  const auto cmd = "ckcheck validate-op" + reproduce_options(o, validate_op_option_table());
  report.reproduce = cmd;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

int run_validate_op(const ValidateOpOptions& o) {
  // The deadline here, or in the ckcheck program that watches this one (--import: a Python process).
  if (o.timeout > 0 && !supervised()) arm_deadline(o.timeout);
  // Checked before any work is done; the library and the imported module are inputs.
  const auto targets = report_targets(o.reports, {o.library, o.import_module});
  const auto report = validate_op_report(o);
  commit_reports(report, targets);
  return report.verdict == Verdict::kPass ? 0 : 1;
}

}  // namespace ckcheck::cli
