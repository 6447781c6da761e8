// What every report format renders: the plain-data result of one ckcheck command.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "checks/check.h"
#include "analyses/bench.h"
#include "analyses/diagnose.h"
#include "analyses/plan.h"
#include "analyses/selftest.h"
#include "analyses/session.h"
#include "analyses/validate_op.h"
#include "harness/runner/compare.h"

namespace ckcheck {

/// One input of the model's step, as the step receives it.
struct InputInfo {
  std::vector<int64_t> shape;
  std::string dtype;
  bool requires_grad = false;
};

struct ModelInfo {
  std::string name;
  std::map<std::string, std::string> options;
  std::vector<std::string> sites;
  std::vector<std::string> candidates;
  std::vector<std::string> checkpointed;  // every site inside a checkpointed unit
  std::vector<std::string> units;         // unit labels ("blocks.0", "blocks.0..blocks.1")
  std::string policy;
  std::vector<std::string> eval_modules;  // modules whose training flag is off during the steps
  std::string checkpoint;                 // the checkpoint under test (ckcheck, torch, torch-reentrant, model)
  std::string checkpoint_reason;          // why that one
  std::vector<InputInfo> inputs;          // the step's inputs: input gradients are compared where they require grad
};

/// run --baseline FILE: the stored verdict, checks and causes against this run's.
struct BaselineComparison {
  std::string path;
  std::vector<std::string> changes;  // "verdict pass -> fail", "rng: pass -> fail", ...; none: unchanged
};

struct Report {
  std::string command = "run";  // run, diagnose, bench, plan, validate-op
  Verdict verdict = Verdict::kPass;
  ModelInfo model;
  nlohmann::json config = nlohmann::json::object();  // every option, defaults filled in
  std::vector<CheckResult> checks;
  std::vector<TensorDiff> tensors;
  std::string reproduce;
  /// What the command found beyond the checks, typed: each format renders it in its own way.
  std::optional<Diagnosis> diagnosis;      // diagnose, run --diagnose
  std::optional<BenchResult> bench;        // bench
  std::optional<MemoryPlan> plan;          // plan
  std::string plan_command;                // plan: the ckcheck run command of the plan recommended
  std::optional<OpValidation> validation;  // validate-op
  std::optional<CheckCost> cost;           // run: the check's CPU time in plain steps
  std::optional<BaselineComparison> baseline;  // run --baseline: what changed against it
  std::optional<PlantOutcome> plant;           // run --plant: the bug planted, and whether it was live
  std::optional<SelftestResult> selftest;      // selftest: the detection matrix
  double seconds = 0.0;
};

/// The tool's version string.
std::string ckcheck_version();

/// What this ckcheck was built against: LibTorch's version and whether CUDA support is compiled in.
struct BuildInfo {
  std::string ckcheck;       ///< ckcheck's own version, e.g. "0.2.0"
  std::string libtorch;      ///< the LibTorch it was compiled against, e.g. "2.14.1"
  bool cuda = false;         ///< CUDA support compiled in
  std::string cuda_version;  ///< the CUDA toolkit, e.g. "13.0"; empty without CUDA
};
BuildInfo build_info();
/// The text of `ckcheck --version`.
std::string version_text();

/// The report as the JSON contract describes it (fields may be added, never renamed). The
/// contract is written in one place, json_reporter.cpp, with the JSON form of each typed section:
nlohmann::json report_json(const Report& report);
nlohmann::json diagnosis_json(const Diagnosis& diagnosis);  // "diagnosis"
nlohmann::json bench_json(const BenchResult& bench);        // the bench fields, at the top level
nlohmann::json validation_json(const OpValidation& validation);  // "validation"
nlohmann::json plan_json(const MemoryPlan& plan);                 // "plan"
nlohmann::json selftest_json(const SelftestResult& selftest);    // "selftest"

/// Writes a report to a stream it is given; never opens files.
class Reporter {
 public:
  virtual ~Reporter() = default;
  virtual void write(const Report& report, std::ostream& out) = 0;
};

std::unique_ptr<Reporter> make_console_reporter(bool color);
std::unique_ptr<Reporter> make_json_reporter();
std::unique_ptr<Reporter> make_junit_reporter();
std::unique_ptr<Reporter> make_markdown_reporter();
std::unique_ptr<Reporter> make_html_reporter();
std::unique_ptr<Reporter> make_baseline_reporter();

/// The baseline CI keeps for a run (--export FILE): the verdict, and each check's status and
/// causes, with the model and the reproduce line that made it.
nlohmann::json baseline_json(const Report& report);
/// A baseline --export wrote (or a whole JSON report), read and checked; throws FieldError
/// ("baseline") for a file that cannot be read or is neither.
nlohmann::json read_baseline(const std::string& path);
/// What changed from `stored` to `now`: the verdict, a check's status or causes, a check run in one
/// only; empty when nothing did.
std::vector<std::string> baseline_changes(const nlohmann::json& stored, const Report& now);

/// One --report argument: FORMAT (standard output) or FORMAT=PATH.
struct ReportTarget {
  /// How the report reaches its target: standard output; a regular file replaced atomically (a
  /// symlink's target, not the link); written through to a character device or a pipe.
  enum class Sink { kStdout, kFile, kStream };
  std::string format;  // console, json, junit, markdown, html
  std::string path;    // "" for standard output; for a file, the path written (symlinks resolved)
  Sink sink = Sink::kStdout;
  std::string given;   // the --report argument, for messages
};

/// Parses FORMAT[=PATH] (PATH '-' is standard output); throws UsageError, before any work is
/// done, for an unknown format or a path that cannot be written: a missing or read-only folder,
/// a folder, a socket or block device, a dangling symlink, a read-only file.
ReportTarget parse_report_target(const std::string& text);

/// The formats --report accepts.
const std::vector<std::string>& report_formats();

/// Writes `report` to every target, all or none: each is rendered first, regular files go to
/// temporary files in their folders, devices and pipes are written through, and only when all of
/// that succeeded are the temporary files renamed over their targets and standard output
/// written. Throws UsageError naming the target that could not be written; no file is changed
/// then.
void write_reports(const Report& report, const std::vector<ReportTarget>& targets,
                   std::ostream& stdout_stream, bool color);

/// Escapes text for HTML and XML (& < > " '), dropping the control characters XML 1.0 forbids.
std::string escape_markup(const std::string& s);

/// Short numbers for tables: 0, 1.2e-07, 0.0123.
std::string format_number(double v);

}  // namespace ckcheck
