// The Check interface, its results, and the one cause vocabulary every finding uses.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ckcheck/model.h"
#include "harness/runner/compare.h"
#include "harness/runner/plan.h"
#include "harness/runner/runner.h"

namespace ckcheck {

/// Why a checkpointed run differs. The names are part of the report contract.
enum class Cause {
  kRng,               // rng
  kInPlace,           // in-place
  kAutocast,          // autocast
  kNonDeterministic,  // non-deterministic
  kStateful,          // stateful
  kBufferUpdate,      // buffer-update
  kMissingGrad,       // missing-grad
  kNonFinite,         // non-finite
  kVacuous,           // vacuous
  kNotEffective,      // not-effective: checkpointing does not lower peak memory
  kTooFine,           // too-fine: checkpointing costs more time than the stated bound
  kHookCount,         // hook-count: a gradient hook fires other than once (DDP's ready marking)
  kGradApi,           // grad-api: the step takes autograd::grad or backward(inputs=) through a checkpoint
  kUnexplained,       // unexplained: the recompute differs from the forward and no check found why
  kAccumulationOrder, // accumulation-order: gradients differ by rounding only, summed in another order
  kAccumulatedGrad,   // accumulated-grad: the checkpointed step changes gradients earlier micro-batches accumulated
};

const char* cause_name(Cause cause);
std::optional<Cause> parse_cause(const std::string& name);
const std::vector<Cause>& all_causes();
/// The fix, in one line, in the words practitioners use.
std::string fix_hint(Cause cause);

enum class Status { kPass, kWarn, kFail, kSkip, kError };
const char* status_name(Status status);

/// One thing a check found: where, what, why and what to do.
struct Finding {
  Cause cause = Cause::kNonDeterministic;
  std::string site;    // module path, "" when the model as a whole
  std::string tensor;  // tensor or op the finding is about, "" when none
  std::string message;
  std::string hint;
  nlohmann::json details = nlohmann::json::object();

  bool operator==(const Finding& o) const;
};

struct CheckResult {
  std::string id;
  Status status = Status::kPass;
  std::string summary;
  std::vector<Finding> findings;
  nlohmann::json details = nlohmann::json::object();
};

std::ostream& operator<<(std::ostream& os, const Finding& f);
std::ostream& operator<<(std::ostream& os, const CheckResult& r);

/// What a check reads. Checks never run models: everything comes from the records.
struct CheckContext {
  const Model& model;
  const Plan& plan;
  const RunConfig& config;
  const Tolerance& tolerance;
  const RunRecords& records;
  /// Reference against checkpointed, one per recorded tensor, in record order.
  const std::vector<TensorDiff>& diffs;
  /// Under AMP: how much further from fp32 the checkpointed gradients may be than the plain
  /// AMP gradients before the autocast check warns.
  double amp_error_factor = 2.0;
  /// run --bench: the most step time checkpointing may add, as a fraction of the plain step's.
  double max_overhead = 0.5;
};

class Check {
 public:
  virtual ~Check() = default;
  /// Stable id, part of the report contract ("gradients", "rng", ...).
  virtual std::string id() const = 0;
  /// One line for `ckcheck list`.
  virtual std::string description() const = 0;
  /// What the Runner must record for this check beyond the two steps.
  virtual Needs needs() const { return {}; }
  /// Whether `ckcheck run` runs it without being asked (memory and overhead need --bench).
  virtual bool by_default() const { return true; }
  virtual CheckResult run(const CheckContext& ctx) const = 0;
};

/// The built-in checks, in report order.
std::vector<std::unique_ptr<Check>> builtin_checks();
/// The checks with these ids (when empty: those run by default, plus memory and overhead when
/// `bench`), in report order; throws UsageError on an unknown id.
std::vector<std::unique_ptr<Check>> select_checks(const std::vector<std::string>& ids, bool bench = false);

/// Ids of the checks that look for one hazard each (as opposed to the symptom checks gradients,
/// buffers and nan).
const std::vector<std::string>& hazard_check_ids();

// One factory per check file.
std::unique_ptr<Check> make_gradients_check();
std::unique_ptr<Check> make_buffers_check();
std::unique_ptr<Check> make_input_mutation_check();
std::unique_ptr<Check> make_rng_check();
std::unique_ptr<Check> make_autocast_check();
std::unique_ptr<Check> make_determinism_check();
std::unique_ptr<Check> make_nan_check();
std::unique_ptr<Check> make_memory_check();
std::unique_ptr<Check> make_overhead_check();
std::unique_ptr<Check> make_hooks_check();
std::unique_ptr<Check> make_data_parallel_check();
std::unique_ptr<Check> make_rank_rng_check();
std::unique_ptr<Check> make_gradient_accumulation_check();

}  // namespace ckcheck
