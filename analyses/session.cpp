#include "analyses/session.h"

#include <algorithm>
#include <optional>
#include <set>

#include "analyses/noise.h"
#include "harness/support/memory.h"

namespace ckcheck {

namespace {

// --tolerance auto: plain reruns beside the repeat every differing run makes (the last with another
// thread count), so that the noise is sampled four times.
constexpr int kNoiseReruns = 3;
// What the diff says of its record besides the values: its name, kind, step and point.
void describe(TensorDiff& d, const TensorRecord& t) {
  d.name = t.name;
  d.kind = t.kind;
  d.step = t.step;
  d.parameter = t.parameter;
  d.micro_batch = t.micro_batch;
}

// The check's cost from the process's CPU clock at its start, once the records were taken and at
// its end, with the records' own parts and the second plain step's time when one ran.
CheckCost cost_of(const RunRecords& records, double start, double recorded, double end,
                  std::optional<double> repeated) {
  const double rerun = records.precision ? records.precision->cpu_seconds : 0.0;
  CheckCost cost;
  cost.seconds = end - start;
  cost.plain_step_seconds = records.reference.cpu_seconds;
  cost.phases = records.cpu_seconds;
  double parts = 0.0;
  for (const auto& phase : records.cpu_seconds) parts += phase.second;
  // What the records took beyond their named parts (restoring state between them, ...).
  cost.phases.emplace_back("records, between parts", std::max(0.0, recorded - start - parts));
  if (repeated) cost.phases.emplace_back("reference, repeated", *repeated);
  if (records.precision) cost.phases.emplace_back("float64 rerun", rerun);
  cost.phases.emplace_back("comparison and checks", std::max(0.0, end - recorded - repeated.value_or(0.0) - rerun));
  return cost;
}
// A difference in the loss, an output or a gradient (state aside) that the float64 rerun can tell
// rounding or real: eager (a compiled model would compile again), autocast off (float64 has no
// autocast: the rerun would be another program), a repeatable plain step, and no recompute that
// drew other random numbers than its forward or read changed inputs (then it is never rounding).
bool needs_precision_evidence(const RunOutcome& out, const Runner& runner) {
  if (out.records.compiled || runner.config().amp != Amp::kOff) return false;
  if (out.records.plain_not_repeated && !out.records.plain_not_repeated->empty()) return false;
  bool recomputed = false;
  for (const auto& c : out.records.checkpointed.calls) {
    if (!c.recomputed) continue;
    recomputed = true;
    const bool other_draws = (c.rng_consumed && !c.rng_replayed) || c.recompute_draws != c.forward_draws;
    const bool changed = !c.state_changed.empty() || c.versions_recompute != c.versions_exit ||
                         std::any_of(c.content_changed.begin(), c.content_changed.end(), [](bool b) { return b; });
    if (other_draws || changed) return false;
  }
  if (!recomputed) return false;
  return std::any_of(out.diffs.begin(), out.diffs.end(), [](const TensorDiff& d) {
    return !d.equal && !is_state_kind(d.kind) && d.missing == "none" && d.note.empty();
  });
}
}  // namespace

std::vector<TensorDiff> compare_records(const StepRecord& reference, const StepRecord& checkpointed,
                                        const Tolerance& tolerance) {
  std::vector<TensorDiff> diffs;
  std::set<std::tuple<std::string, std::string, int64_t>> seen;
  for (const auto& t : reference.tensors) {
    const auto* other = checkpointed.find(t.name, t.kind, t.step);
    TensorDiff d;
    // A tensor the checkpointed step did not record (it may have stopped) is missing there.
    d = compare_tensors(t.value, other ? other->value : torch::Tensor(), tolerance);
    if (!other && !t.value.defined()) {
      d.equal = false;
      d.missing = "checkpointed";
    }
    describe(d, t);
    seen.insert({t.name, t.kind, t.step});
    diffs.push_back(d);
  }
  for (const auto& t : checkpointed.tensors) {
    if (seen.count({t.name, t.kind, t.step}) || !reference.error.empty()) continue;
    TensorDiff d = compare_tensors(torch::Tensor(), t.value, tolerance);
    describe(d, t);
    diffs.push_back(d);
  }
  return diffs;
}

RunOutcome run_checks(Runner& runner, const Plan& plan, const Tolerance& tolerance,
                      const std::vector<std::unique_ptr<Check>>& checks, const std::map<std::string, double>& knobs,
                      const std::function<void(RunRecords&)>& after_records) {
  Needs needs;
  for (const auto& c : checks) needs |= c->info().needs;
  // A planted run (selftest) tells whether its plant changed anything by every record, whichever
  // checks it makes: the hooks' counts too.
  needs.hooks = needs.hooks || runner.config().plant != nullptr;
  RunOutcome out;
  const double cpu0 = process_cpu_seconds();
  out.records = runner.run_all(plan, needs);
  const double cpu_records = process_cpu_seconds();
  std::optional<double> repeated;  // the second plain step's CPU time, when one ran
  if (after_records) after_records(out.records);
  // Under --tolerance auto a step's tensors are compared bitwise, then against the plain step's noise.
  const Tolerance step_tolerance = tolerance.automatic() ? Tolerance{} : tolerance;
  out.diffs = compare_records(out.records.reference, out.records.checkpointed, step_tolerance);
  if (out.records.interleaved_reference && out.records.interleaved_checkpointed) {
    out.records.interleaved_diffs =
        compare_records(*out.records.interleaved_reference, *out.records.interleaved_checkpointed, step_tolerance);
  }
  // When the checkpointed step differs, is the plain step itself repeatable? If two plain steps
  // from the same restored state differ, checkpointing is not to blame. (One process only: ranks
  // would have to repeat in lockstep.)
  const bool differs = std::any_of(out.diffs.begin(), out.diffs.end(), [](const TensorDiff& d) { return !d.equal; });
  if (differs && out.records.reference.error.empty() && out.records.checkpointed.error.empty() &&
      runner.config().data_parallel == nullptr) {
    const double cpu_repeat = process_cpu_seconds();
    StepOptions plain;
    plain.evidence = false;
    const auto again = runner.run(nullptr, plain, "reference-repeat");
    std::vector<std::string> names;
    if (tolerance.automatic()) {
      out.records.noise = measure_noise(runner, out.records.reference, again, kNoiseReruns);
      names = noise_beyond_rounding(*out.records.noise, out.records.reference);
      within_noise(out.diffs, *out.records.noise);
    } else {
      for (const auto& d : compare_records(out.records.reference, again, tolerance)) {
        if (!d.equal) names.push_back(d.name);
      }
    }
    out.records.plain_not_repeated = names;
    repeated = process_cpu_seconds() - cpu_repeat;
    if (needs_precision_evidence(out, runner)) {
      out.records.precision = runner.rerun_in_float64(plan);
    }
  }
  CheckContext ctx{runner.model(), plan, runner.config(), tolerance, out.records, out.diffs, knobs};
  for (const auto& c : checks) out.results.push_back(c->run(ctx));
  out.cost = cost_of(out.records, cpu0, cpu_records, process_cpu_seconds(), repeated);
  return out;
}

}  // namespace ckcheck
