#include "harness/support/enum_names.h"
#include "checks/check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "harness/support/errors.h"

namespace ckcheck {

namespace {

// The words every analysis shares. A word only one check uses lives in that check's file.
constexpr CauseWord kRngWord{"rng",
    "keep RNG state: checkpoint with preserve_rng_state (the default), and draw random "
    "numbers from the default generator, not a private torch::Generator"};
constexpr CauseWord kInPlaceWord{"in-place",
    "never modify a checkpointed segment's input in place: clone the input first, or "
    "move the in-place op out of the segment"};
constexpr CauseWord kAutocastWord{"autocast",
    "restore autocast in the recompute (restore_autocast, the default) and keep the "
    "segment's precision independent of grad mode"};
constexpr CauseWord kRecomputeDtypeWord{"recompute-dtype",
    "recompute in the forward's dtype: checkpoint inside the FSDP unit (checkpoint_wrapper or "
    "checkpoint on the block, then fully_shard) so the recompute gets the same mixed-precision "
    "parameters, and never choose a segment's dtype by call count or grad mode"};
constexpr CauseWord kNonDeterministicWord{"non-deterministic",
    "exclude the non-deterministic op or module from checkpointing (keep its "
    "activations), or make it deterministic"};
constexpr CauseWord kStatefulWord{"stateful",
    "exclude the stateful module from checkpointing, or skip its state update while "
    "ckcheck::is_recomputing()"};
constexpr CauseWord kBufferUpdateWord{"buffer-update",
    "restore the segment's buffers after the recompute (--restore-buffers, "
    "CheckpointOptions::restore_buffers) or skip the update while is_recomputing()"};
constexpr CauseWord kMissingGradWord{"missing-grad",
    "make the segment's input require grad, or use a checkpoint that handles inputs "
    "without grad (ckcheck::checkpoint does)"};
constexpr CauseWord kNonFiniteWord{"non-finite",
    "run `ckcheck diagnose` to find the first op that produced NaN/Inf; keep the "
    "recompute in fp32 if it appears only with checkpointing"};
constexpr CauseWord kVacuousWord{"vacuous",
    "equality proves nothing here: initialise the model so gradients reach the "
    "checkpointed sites (a zero-initialised head blocks them) or check another seed"};
constexpr CauseWord kNotEffectiveWord{"not-effective",
    "activations are not the bottleneck, or the checkpoints are not applied: measure "
    "with ckcheck bench; use mixed precision or optimizer-state sharding instead"};
constexpr CauseWord kTooFineWord{"too-fine",
    "checkpoints too fine: checkpoint every ~4 blocks (every:4), or only the modules "
    "with large activations (sites:*.attn)"};
constexpr CauseWord kHookCountWord{"hook-count",
    "a reentrant checkpoint runs a backward per checkpointed call: checkpoint a shared "
    "module once per forward, or use DDP's static_graph=True or a non-reentrant checkpoint"};
constexpr CauseWord kGradApiWord{"grad-api",
    "a reentrant checkpoint cannot serve autograd::grad or backward(inputs=): take that "
    "gradient outside the checkpointed sites, or use a checkpoint that can "
    "(torch.utils.checkpoint with use_reentrant=False, or ckcheck::checkpoint)"};
constexpr CauseWord kUnexplainedWord{"unexplained",
    "run `ckcheck diagnose` with the same options: it finds the first op whose recompute differs (keep that "
    "site's activations, excluding it from checkpointing, until the cause is fixed), or shows that every "
    "recompute matched and the gradient changed outside the recomputed ops (a hook, code that assigns .grad)"};
constexpr CauseWord kAccumulationOrderWord{"accumulation-order",
    "rounding, not a wrong gradient: a reentrant checkpoint sums the gradient of a tensor used by several "
    "checkpointed calls in another order; compare with a tolerance (--tolerance rtol=1e-5,atol=1e-7) or use "
    "a non-reentrant checkpoint (torch.utils.checkpoint with use_reentrant=False) for bitwise equality"};
constexpr CauseWord kReentrantNoGradWord{"reentrant-no-grad",
    "a reentrant checkpoint runs its segment's forward without autograd, so what is kept from inside it (features "
    "captured by hooks, MoE router logits for a load-balancing loss) carries no graph: use "
    "torch.utils.checkpoint with use_reentrant=False, or compute such terms outside the checkpointed segment"};
constexpr CauseWord kGradModeWord{"grad-mode",
    "the segment computes other values with autograd on than off (a kernel chosen by whether gradients are "
    "needed, as scaled_dot_product_attention's with a mask that requires grad), and a checkpoint that runs its "
    "forward without autograd (use_reentrant=True, ckcheck::checkpoint) recomputes with it: use "
    "torch.utils.checkpoint with use_reentrant=False, or compare with a tolerance if the difference is rounding"};

}  // namespace

const Cause Cause::kRng{kRngWord};
const Cause Cause::kInPlace{kInPlaceWord};
const Cause Cause::kAutocast{kAutocastWord};
const Cause Cause::kRecomputeDtype{kRecomputeDtypeWord};
const Cause Cause::kNonDeterministic{kNonDeterministicWord};
const Cause Cause::kStateful{kStatefulWord};
const Cause Cause::kBufferUpdate{kBufferUpdateWord};
const Cause Cause::kMissingGrad{kMissingGradWord};
const Cause Cause::kNonFinite{kNonFiniteWord};
const Cause Cause::kVacuous{kVacuousWord};
const Cause Cause::kNotEffective{kNotEffectiveWord};
const Cause Cause::kTooFine{kTooFineWord};
const Cause Cause::kHookCount{kHookCountWord};
const Cause Cause::kGradApi{kGradApiWord};
const Cause Cause::kUnexplained{kUnexplainedWord};
const Cause Cause::kAccumulationOrder{kAccumulationOrderWord};
const Cause Cause::kReentrantNoGrad{kReentrantNoGradWord};
const Cause Cause::kGradMode{kGradModeWord};

std::ostream& operator<<(std::ostream& os, const Cause& cause) { return os << cause.name(); }

const std::vector<Cause>& all_causes() {
  static const std::vector<Cause> causes = [] {
    std::vector<Cause> v = {Cause::kRng,         Cause::kInPlace,      Cause::kAutocast,    Cause::kNonDeterministic,
                            Cause::kStateful,    Cause::kBufferUpdate, Cause::kMissingGrad, Cause::kNonFinite,
                            Cause::kVacuous,     Cause::kNotEffective, Cause::kTooFine,     Cause::kHookCount,
                            Cause::kGradApi,     Cause::kUnexplained,  Cause::kAccumulationOrder,
                            Cause::kReentrantNoGrad, Cause::kRecomputeDtype, Cause::kGradMode};
    for (const auto& c : builtin_checks()) v.insert(v.end(), c->info().causes.begin(), c->info().causes.end());
    return v;
  }();
  return causes;
}

std::optional<Cause> parse_cause(const std::string& name) {
  for (auto c : all_causes()) {
    if (name == c.name()) return c;
  }
  return std::nullopt;
}

namespace {

constexpr EnumName<Status> kStatusNames[] = {
    {Status::kPass, "pass"}, {Status::kWarn, "warn"}, {Status::kFail, "fail"},
    {Status::kSkip, "skip"}, {Status::kError, "error"},
};

constexpr EnumName<Verdict> kVerdictNames[] = {
    {Verdict::kPass, "pass"}, {Verdict::kFail, "fail"}, {Verdict::kError, "error"}};

constexpr EnumName<CheckKind> kCheckKindNames[] = {
    {CheckKind::kSymptom, "symptom"}, {CheckKind::kHazard, "hazard"},
    {CheckKind::kMeasurement, "measurement"}, {CheckKind::kTraining, "training"}};

}  // namespace

const char* status_name(Status status) { return name_in(kStatusNames, status); }

std::optional<Status> parse_status(const std::string& name) { return parse_in(kStatusNames, name); }

const char* verdict_name(Verdict verdict) { return name_in(kVerdictNames, verdict); }

std::optional<Verdict> parse_verdict(const std::string& name) { return parse_in(kVerdictNames, name); }

Verdict verdict_of(const std::vector<CheckResult>& results) {
  bool error = false;
  for (const auto& r : results) {
    if (r.status == Status::kFail) return Verdict::kFail;
    error = error || r.status == Status::kError;
  }
  return error ? Verdict::kError : Verdict::kPass;
}

bool Finding::operator==(const Finding& o) const {
  return cause == o.cause && site == o.site && tensor == o.tensor && message == o.message &&
         hint == o.hint && details == o.details;
}

std::ostream& operator<<(std::ostream& os, const Finding& f) {
  os << "[" << cause_name(f.cause) << "]";
  if (!f.site.empty()) os << " " << f.site;
  if (!f.tensor.empty()) os << " " << f.tensor;
  return os << ": " << f.message;
}

std::ostream& operator<<(std::ostream& os, const CheckResult& r) {
  os << r.id << ": " << status_name(r.status) << " - " << r.summary;
  for (const auto& f : r.findings) os << "\n  " << f;
  return os;
}

const char* check_kind_name(CheckKind kind) { return name_in(kCheckKindNames, kind); }

namespace {

std::vector<std::function<std::unique_ptr<Check>()>>& registry() {
  static std::vector<std::function<std::unique_ptr<Check>()>> makers;
  return makers;
}

}  // namespace

CheckRegistration::CheckRegistration(std::function<std::unique_ptr<Check>()> make) {
  registry().push_back(std::move(make));
}

std::vector<std::unique_ptr<Check>> builtin_checks() {
  std::vector<std::unique_ptr<Check>> v;
  for (const auto& make : registry()) v.push_back(make());
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a->info().order < b->info().order; });
  return v;
}

namespace {

// Throws UsageError naming the checks when `id` is none of `all`.
void require_known(const std::vector<std::unique_ptr<Check>>& all, const std::string& id) {
  std::vector<std::string> known;
  for (const auto& c : all) {
    if (c->id() == id) return;
    known.push_back(c->id());
  }
  throw UsageError(fmt::format("unknown check '{}'; checks: {}", id, fmt::join(known, ", ")));
}

}  // namespace

std::unique_ptr<Check> make_check(const std::string& id) {
  auto all = builtin_checks();
  require_known(all, id);
  for (auto& c : all) {
    if (c->id() == id) return std::move(c);
  }
  return nullptr;  // not reached: require_known threw
}

namespace {

bool applies(Applies when, const Situation& s) {
  switch (when) {
    case Applies::kAlways: return true;
    case Applies::kWithBench: return s.bench;
    case Applies::kWithAccumulation: return s.accumulation;
    case Applies::kWithCompile: return s.compile;
    case Applies::kWithOffload: return s.offload;
  }
  return false;
}

}  // namespace

std::vector<std::unique_ptr<Check>> select_checks(const std::vector<std::string>& ids, const Situation& situation) {
  auto all = builtin_checks();
  std::vector<std::unique_ptr<Check>> out;
  if (ids.empty()) {
    // The situation's own checks follow the others: they report on what the run adds.
    for (const bool general : {true, false}) {
      for (auto& c : all) {
        if (!c) continue;  // taken in the first pass
        const auto when = c->info().applies;
        const bool is_general = when == Applies::kAlways || when == Applies::kWithBench;
        if (is_general == general && applies(when, situation)) out.push_back(std::move(c));
      }
    }
    return out;
  }
  for (const auto& id : ids) require_known(all, id);  // an unknown id is an error, whatever else is asked
  for (auto& c : all) {
    if (std::find(ids.begin(), ids.end(), c->id()) != ids.end()) out.push_back(std::move(c));
  }
  return out;
}

std::vector<std::string> hazard_check_ids() {
  std::vector<std::string> ids;
  for (const auto& c : builtin_checks()) {
    if (c->info().kind == CheckKind::kHazard) ids.push_back(c->id());
  }
  return ids;
}

const CheckKnob& find_knob(const std::string& name) {
  static const auto knobs = [] {
    std::vector<CheckKnob> all;
    for (const auto& c : builtin_checks()) all.insert(all.end(), c->info().knobs.begin(), c->info().knobs.end());
    return all;
  }();
  for (const auto& k : knobs) {
    if (k.name == name) return k;
  }
  throw UsageError(fmt::format("no check has a knob '{}'", name));
}

}  // namespace ckcheck
