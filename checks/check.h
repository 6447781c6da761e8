// The Check interface, its results, and the one cause vocabulary every finding uses.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckcheck/model.h"
#include "harness/runner/compare.h"
#include "harness/runner/plan.h"
#include "harness/runner/runner.h"

namespace ckcheck {

/// One word of the cause vocabulary: its name in reports (part of the report contract) and the
/// fix, in one line, in the words practitioners use.
struct CauseWord {
  const char* name;
  const char* hint;
};

/// Why a checkpointed run differs: a word of the vocabulary. The words every analysis shares are
/// Cause::kRng and its siblings (check.cpp); a check that brings a word of its own declares it in
/// its file and lists it in its CheckInfo::causes:
///
///   constexpr CauseWord kMyWord{"my-cause", "the fix, in one line"};
///   const Cause kMyCause{kMyWord};
///
/// A Cause is a handle to its word: copied freely, compared by identity.
class Cause {
 public:
  constexpr explicit Cause(const CauseWord& word) : word_(&word) {}
  const char* name() const { return word_->name; }
  const char* hint() const { return word_->hint; }
  bool operator==(const Cause& o) const { return word_ == o.word_; }
  bool operator!=(const Cause& o) const { return word_ != o.word_; }
  /// By name, for sets and sorted listings.
  bool operator<(const Cause& o) const { return std::string_view(name()) < std::string_view(o.name()); }

  static const Cause kRng;               // rng
  static const Cause kInPlace;           // in-place
  static const Cause kAutocast;          // autocast
  static const Cause kNonDeterministic;  // non-deterministic
  static const Cause kStateful;          // stateful
  static const Cause kBufferUpdate;      // buffer-update
  static const Cause kMissingGrad;       // missing-grad
  static const Cause kNonFinite;         // non-finite
  static const Cause kVacuous;           // vacuous
  static const Cause kNotEffective;      // not-effective: checkpointing does not lower peak memory
  static const Cause kTooFine;           // too-fine: checkpointing costs more time than the stated bound
  static const Cause kHookCount;         // hook-count: a gradient hook fires other than once (DDP's ready marking)
  static const Cause kGradApi;           // grad-api: autograd::grad or backward(inputs=) through a reentrant checkpoint
  static const Cause kUnexplained;       // unexplained: the recompute differs and no check found why
  static const Cause kAccumulationOrder; // accumulation-order: gradients differ by rounding only, summed in another order
  static const Cause kReentrantNoGrad;   // reentrant-no-grad: something kept from a forward run without autograd
  static const Cause kRecomputeDtype;    // recompute-dtype: the recompute ran in another dtype, autocast off (FSDP2 mixed precision)
  static const Cause kGradMode;          // grad-mode: the segment computes other values with autograd on than off

 private:
  const CauseWord* word_;
};
std::ostream& operator<<(std::ostream& os, const Cause& cause);

inline const char* cause_name(Cause cause) { return cause.name(); }
/// The fix, in one line, in the words practitioners use.
inline std::string fix_hint(Cause cause) { return cause.hint(); }
/// The whole vocabulary: the shared words, then those the registered checks bring, in check order.
const std::vector<Cause>& all_causes();
std::optional<Cause> parse_cause(const std::string& name);

enum class Status { kPass, kWarn, kFail, kSkip, kError };
/// "pass", "warn", "fail", "skip", "error": the report contract's words.
const char* status_name(Status status);
std::optional<Status> parse_status(const std::string& name);

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

/// The verdict of a command: pass, fail (a check failed, or something diverges), error (a check
/// could not judge and none failed).
enum class Verdict { kPass, kFail, kError };
/// "pass", "fail", "error": the report contract's words.
const char* verdict_name(Verdict verdict);
std::optional<Verdict> parse_verdict(const std::string& name);

/// pass when no check failed or errored, fail when one failed, error when one errored and none
/// failed.
Verdict verdict_of(const std::vector<CheckResult>& results);

std::ostream& operator<<(std::ostream& os, const Finding& f);
std::ostream& operator<<(std::ostream& os, const CheckResult& r);

/// What a check looks at: its group in `ckcheck list`, and for diagnose, which checks explain a
/// divergence (the hazards).
enum class CheckKind {
  kSymptom,      // compares what the two steps produced: gradients, buffers, NaN
  kHazard,       // finds one cause of a divergence in the checkpointed calls' evidence
  kMeasurement,  // memory and time of the steps (run --bench)
  kTraining,     // a training setup: gradient hooks, accumulation, data parallelism
};
const char* check_kind_name(CheckKind kind);

/// A number that tunes a check, declared by the check with its default written once. `ckcheck
/// run` offers it as --NAME; reports carry its value and reproduce lines it when given.
struct CheckKnob {
  std::string name;  // as the option is spelled, without "--": "amp-error-factor"
  std::string help;
  double default_value = 0;
  double min = 0, max = 0;  // accepted values (finite)
  bool min_open = false;    // min itself is not accepted
};

/// When a check runs without being named (--checks): always, or in the situation it is about.
enum class Applies {
  kAlways,
  kWithBench,         // run --bench: memory and time
  kWithAccumulation,  // run --accumulate N (N > 1)
  kWithCompile,       // run --compile
  kWithOffload,       // run --offload cpu
};

/// What of a run decides which checks apply (select_checks).
struct Situation {
  bool bench = false, accumulation = false, compile = false, offload = false;
};

/// Everything a check says about itself, in one place: its own file.
struct CheckInfo {
  /// The four things every check states; the rest have defaults a check sets when it differs.
  CheckInfo(std::string id_, CheckKind kind_, int order_, std::string description_)
      : id(std::move(id_)), kind(kind_), order(order_), description(std::move(description_)) {}

  std::string id;           // stable, part of the report contract ("gradients", "rng", ...)
  CheckKind kind = CheckKind::kSymptom;
  int order = 0;            // place in reports and `ckcheck list` (ascending)
  std::string description;  // one line for `ckcheck list`
  Applies applies = Applies::kAlways;  // when it runs without being named
  Needs needs;              // what the Runner must record for it beyond the two steps
  std::vector<CheckKnob> knobs;
  std::vector<Cause> causes;  // words this check adds to the cause vocabulary (beyond Cause::k*)

  // What differs from the defaults, declared in one expression:
  //   CheckInfo{"rng", CheckKind::kHazard, 40, "..."}.needing(&Needs::probe)
  CheckInfo& applying(Applies when) { applies = when; return *this; }
  CheckInfo& needing(bool Needs::*evidence) { needs.*evidence = true; return *this; }
  CheckInfo& with_knobs(std::vector<CheckKnob> k) { knobs = std::move(k); return *this; }
  CheckInfo& with_causes(std::vector<Cause> c) { causes = std::move(c); return *this; }
};

/// What a check reads. Checks never run models: everything comes from the records.
struct CheckContext {
  const Model& model;
  const Plan& plan;
  const RunConfig& config;
  const Tolerance& tolerance;
  const RunRecords& records;
  /// Reference against checkpointed, one per recorded tensor, in record order.
  const std::vector<TensorDiff>& diffs;
  /// Knob values by name; a knob not given here has its declared default.
  std::map<std::string, double> knobs = {};

  double knob(const CheckKnob& k) const {
    const auto it = knobs.find(k.name);
    return it == knobs.end() ? k.default_value : it->second;
  }
};

class Check {
 public:
  virtual ~Check() = default;
  virtual const CheckInfo& info() const = 0;
  virtual CheckResult run(const CheckContext& ctx) const = 0;
  const std::string& id() const { return info().id; }
};

/// A check whose declaration is given once, when it is made: every built-in check is one.
///   class RngCheck : public DeclaredCheck {
///    public:
///     RngCheck() : DeclaredCheck(CheckInfo{"rng", CheckKind::kHazard, 40, "..."}.needing(&Needs::probe)) {}
///     CheckResult run(const CheckContext& ctx) const override { auto r = result(); ... }
///   };
class DeclaredCheck : public Check {
 public:
  explicit DeclaredCheck(CheckInfo info) : info_(std::move(info)) {}
  const CheckInfo& info() const final { return info_; }

 protected:
  /// An empty result under this check's id (status pass until a finding or a status says otherwise).
  CheckResult result() const {
    CheckResult r;
    r.id = info_.id;
    return r;
  }

 private:
  CheckInfo info_;
};

/// A check registers itself from its own file, at static initialisation:
///
///   CKCHECK_REGISTER_CHECK(GradientsCheck);
///
/// (ckcheck_checks is linked whole, so no check file is left out of the program.)
struct CheckRegistration {
  explicit CheckRegistration(std::function<std::unique_ptr<Check>()> make);
};
#define CKCHECK_REGISTER_CHECK(Class)                                                  \
  static const ::ckcheck::CheckRegistration ckcheck_registration_##Class(             \
      [] { return std::unique_ptr<::ckcheck::Check>(std::make_unique<Class>()); })

/// The registered checks, in report order.
std::vector<std::unique_ptr<Check>> builtin_checks();
/// The check with this id; throws UsageError naming the checks when there is none.
std::unique_ptr<Check> make_check(const std::string& id);
/// The checks with these ids, in report order; when none are named, those that apply to the
/// situation: the ones that always do and those of --bench, in report order, then those of
/// accumulation, compiled training and offloading. Throws UsageError on an unknown id.
std::vector<std::unique_ptr<Check>> select_checks(const std::vector<std::string>& ids, const Situation& situation = {});

/// Ids of the checks of kind kHazard, which look for one hazard each (as opposed to the symptom
/// checks gradients, buffers and nan).
std::vector<std::string> hazard_check_ids();

/// The knob with this name, of whichever check declares it; throws UsageError when none does.
const CheckKnob& find_knob(const std::string& name);

}  // namespace ckcheck
