// The Runner: the only place that executes training steps. It runs a model plainly (the
// reference) and under a plan (checkpointed), from the same state, seed and inputs, and records
// everything the checks compare, as plain data.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckcheck/checkpoint.h"
#include "ckcheck/model.h"
#include "harness/runner/compare.h"
#include "harness/runner/data_parallel.h"
#include "harness/runner/plan.h"
#include "harness/runner/plant.h"
#include "harness/runner/trace.h"

namespace ckcheck {

enum class Amp { kOff, kBf16, kFp16 };
const char* amp_name(Amp amp);
/// Parses off, bf16 or fp16; throws UsageError otherwise.
Amp parse_amp(const std::string& text);

/// The order of a step's micro-batches: each forward followed by its backward (sequential), or
/// every forward first and then the backwards in the same order (interleaved) or the reverse
/// (reversed), as pipeline schedules and multi-forward losses run them.
enum class Schedule { kSequential, kInterleaved, kReversed };
const char* schedule_name(Schedule schedule);
/// Parses sequential, interleaved or reversed; throws UsageError otherwise.
Schedule parse_schedule(const std::string& text);

/// The checkpoint's protections in a run, in one place: what every checkpointed unit's
/// CheckpointOptions say (switched off only to prove that the checks catch the hazards they guard
/// against).
struct CheckpointProtections {
  bool preserve_rng_state = true;
  bool restore_autocast = true;
  bool check_input_versions = true;
  bool recompute_fp32 = false;
  bool restore_buffers = false;  // restore each checkpointed site's buffers after its recompute

  /// The CheckpointOptions they stand for (the site runner adds the unit's name, buffers and
  /// observer).
  CheckpointOptions options() const;
};

/// How the steps run.
struct RunConfig {
  uint64_t seed = 0;
  int64_t steps = 1;
  double lr = 0.01;  // the SGD step taken between steps when steps > 1
  torch::Device device = torch::kCPU;
  Amp amp = Amp::kOff;
  CheckpointProtections checkpoint;
  /// Gradient accumulation: each step runs this many micro-batches (inputs of seeds seed,
  /// seed+1, ...), each with its forward and backward, their gradients summed before the update.
  int64_t accumulate = 1;
  /// The order the micro-batches' forwards and backwards run in (the plain and checkpointed steps alike).
  Schedule schedule = Schedule::kSequential;
  /// Make every floating-point input require grad (--input-requires-grad). Off by default: the
  /// inputs keep the requires_grad their model gave them, as in the user's training step, where a
  /// batch never requires grad -- a checkpoint that works only because its input requires grad
  /// (a reentrant one under a frozen first layer) must not be checked with one that does.
  bool input_requires_grad = false;
  /// Data-parallel training: each rank runs its shard of the global batch with its own RNG
  /// stream, and gradients are averaged over the ranks in buckets filled by hooks. Not owned.
  DataParallel* data_parallel = nullptr;
  /// Run the determinism probe on every checkpointed unit (--probe-every-unit). By default only a
  /// unit whose recompute did not reproduce its forward bitwise is probed (or one the checkpointed
  /// step did not show): the recompute already is a second run of the unit on its inputs.
  bool probe_every_unit = false;
  /// --poison: after each checkpointed call's forward, the floating-point state its unit reads that
  /// the model's forward rewrote before it (CallEvidence::state_rewritten) is overwritten with NaN,
  /// so that a recompute or backward that reads it before the program refills it fails loudly.
  bool poison_rewritten = false;
  /// Every floating-point input converted to this dtype as it is made (the float64 rerun, whose
  /// parameters and state Runner::rerun_in_float64 converts); as the model makes them otherwise.
  std::optional<c10::ScalarType> compute_dtype;
  /// ckcheck selftest: a bug planted into one site (run --plant CLASS@SITE); none otherwise.
  std::shared_ptr<Plant> plant;
};

/// One recorded tensor of a step.
struct TensorRecord {
  std::string name;
  std::string kind;  // loss, output, param-grad, input-grad, buffer
  int64_t step = 1;
  torch::Tensor value;  // undefined when there is none (a parameter without gradient)
  bool requires_grad = false;  // outputs: whether the step's output carried a graph
  // kPartialGradKind: the parameter whose gradient it is and the micro-batch after which it was
  // taken (the name says both, for people; the checks read these).
  std::string parameter{};
  int64_t micro_batch = 0;
};

/// What one checkpointed call showed during a recorded step.
struct CallEvidence {
  std::string site;  // the unit: a site, or "first..last" for a segment
  int64_t call = 0;
  int64_t step = 1;
  std::vector<int64_t> versions_entry, versions_exit, versions_recompute;
  std::vector<bool> content_changed;  // input content at the recompute differs from the entry
  /// How many input tensors the call had at its forward and at its recompute: they differ where a
  /// list or dict it is handed was changed in between (an item popped, appended or replaced).
  size_t inputs_forward = 0, inputs_recompute = 0;
  /// The module-level variables of the model's code ("FILE:NAME") its forward and its (first)
  /// recompute wrote (Model::module_variables).
  std::vector<std::string> variables_forward, variables_recompute;
  /// Model state (parameters, buffers, tensor and scalar attributes) changed after the site's
  /// forward and before its recompute -- by the parent or a later site -- by name.
  std::vector<std::string> state_changed;
  /// State the unit reads that the model's forward wrote before the unit's forward began (a
  /// workspace the parent refills, a parameter an engine gathers): the next micro-batch's forward
  /// writes it again, before this call's recompute where a schedule interleaves them
  /// (StepOptions::watch_rewrites).
  std::vector<std::string> state_rewritten;
  /// Those of them --poison overwrote with NaN after the call's forward.
  std::vector<std::string> state_poisoned;
  /// Those of them the model reaches through several module paths (a shared module): how many.
  std::map<std::string, size_t> state_paths;
  bool rng_consumed = false;          // the default generators moved during the forward
  uint64_t rng_print = 0;             // when it drew: the generators' state after its draws, hashed (rank-rng)
  bool rng_replayed = true;           // the recompute ended in the RNG state the forward ended in
  /// Every random op of the forward and of the (first) recompute, in order, with its generator's
  /// state -- also draws a forked or explicit generator makes, which leave the default one as it was.
  std::vector<RandomDraw> forward_draws, recompute_draws;
  /// The collectives and point-to-point operations the forward and the (first) recompute issued,
  /// in order: "c10d::allreduce_ 8x16 Float".
  std::vector<std::string> forward_collectives, recompute_collectives;
  bool forward_no_grad = false;       // the forward ran without autograd (a reentrant checkpoint)
  bool inputs_require_grad = false;   // some input required grad as the forward began
  bool recomputed = false;            // backward reached the call
  bool recompute_failed = false;      // the recompute started and threw
  bool grad_all_zero = true;          // every gradient that reached it was zero (or none did)
  std::vector<TensorDiff> output_diffs;  // recomputed outputs against the forward's (bitwise)
  // Op names and output dtypes inside the call (when traced at kDtypes or above).
  std::vector<std::string> forward_ops, recompute_ops;
  std::vector<std::string> forward_dtypes, recompute_dtypes;
  std::vector<std::string> forward_autocast, recompute_autocast;  // the state each op ran under
  /// Every op inside the call, at any depth, that gives a reduced-precision dtype (float8, bf16,
  /// fp16, quantized), as "op -> dtypes", in order: what a precision context (float8 training, a
  /// quantized layer's switch) makes the call do, wherever the op sits.
  std::vector<std::string> forward_precision_ops, recompute_precision_ops;
};

/// How often a parameter's gradient hook fired in one backward (DDP marks it ready each time).
struct HookCount {
  std::string name;
  int64_t step = 1;
  int64_t fires = 0;
  int64_t micro_batch = 1;  // under gradient accumulation, the micro-batch of the step
  // Of `fires`, those in which no gradient arrived: a node upstream returned none for it (an output
  // the loss does not use). DDP takes such a parameter as unused, as if its hook had not fired.
  int64_t fires_without_gradient = 0;

  /// The same hook at the same point of a step (parameter, step, micro-batch): what a count of
  /// the checkpointed step is compared with.
  bool same_point(const HookCount& o) const { return name == o.name && step == o.step && micro_batch == o.micro_batch; }
};

/// The record kind of a parameter's gradient as it stands after each micro-batch but the last
/// (under gradient accumulation), named "NAME after micro-batch K" (TensorRecord::parameter and
/// micro_batch hold NAME and K).
constexpr const char* kPartialGradKind = "param-grad-partial";

struct StepRecord {
  std::string label;  // reference, checkpointed, ...
  std::vector<TensorRecord> tensors;
  std::vector<CallEvidence> calls;
  std::vector<OpRecord> ops;  // when traced
  std::vector<HookCount> hooks;  // when counted
  uint64_t rng_start = 0;     // fingerprint of the CPU generator's state as the step began
  bool forward_draws = false;  // some forward of the run moved the default generators (dropout anywhere)
  std::string error;          // what the step threw, if it threw
  std::string output_structure;  // what the forward returned, without values ("" when the model cannot say)
  double seconds = 0.0;
  double cpu_seconds = 0.0;   // the process's CPU time over the step (all threads)
  int64_t plant_calls = -1;   // selftest: how often the planted site ran in the forwards (-1: no plant)

  const TensorRecord* find(const std::string& name, const std::string& kind, int64_t step) const;
};

/// What repeating a checkpointed unit on identical inputs showed (the determinism probe).
struct UnitProbe {
  std::string site;
  int64_t step = 1;
  bool repeat_equal = true;   // a second call, from the state the first left, gives equal outputs
  bool restart_equal = true;  // a call from the restored state gives equal outputs
  // Probed without autograd (as a reentrant checkpoint's forward runs): a call from the restored
  // state with autograd on, as the recompute runs, gives equal outputs. Tried only where the
  // restarts agree (a deterministic unit).
  bool grad_mode_equal = true;
  double grad_mode_diff = 0.0;  // largest output difference between the two
  double max_abs_diff = 0.0;  // largest output difference seen
  std::vector<std::string> changed_state;  // state the first call changed (buffers, extra state)
  std::vector<std::string> random_ops;     // random-number ops the unit ran
  bool private_generator = false;          // one of them used a non-default generator
  bool rng_consumed = false;               // the default generators moved during the call
  std::vector<std::string> host_generators;  // generators outside torch the call moved (numpy.random)
  std::vector<std::string> handed_state;     // arguments whose contents the call changed (a cache)
  // The first call's outputs and those of the call that differed from them (restart, or repeat
  // when the restart was equal), so a check can apply its own tolerance.
  std::vector<torch::Tensor> first_outputs, other_outputs;
  std::string repeat_error;  // what the second call threw, where it threw and the restarts did not
  std::string error;
};

/// Memory and time of training steps under one plan (ckcheck bench, run --bench).
struct Measurement {
  bool fits = true;            // false when the step ran out of device memory
  std::string error;           // what stopped the measurement, if anything
  int64_t baseline_bytes = 0;  // parameters, gradients and inputs, allocated before the steps
  int64_t peak_bytes = 0;      // most bytes above the baseline during a measured step
  std::vector<double> step_seconds;     // forward + backward, per measured step (wall clock)
  std::vector<double> forward_seconds;  // the forward alone, per measured step
  std::vector<double> cpu_seconds;      // the process's CPU time of each measured step
  std::vector<int64_t> instructions;    // instructions retired per step, where counting works
};

/// One tensor of the float64 rerun: how far its checkpointed value lies from its plain value there,
/// and its plain value's largest magnitude.
struct PrecisionDiff {
  std::string name;
  std::string kind;
  int64_t step = 1;
  double max_abs = 0.0;  // 0 when equal
  double scale = 0.0;
  bool present = true;   // false when one side of the rerun has no such tensor
};

/// The plain and checkpointed steps run again in float64 from the same state, seed and inputs (the
/// evidence that tells rounding from a real difference: rounding shrinks by the ratio of the two
/// precisions, a lost or changed contribution keeps its size).
struct PrecisionRerun {
  std::string dtype = "float64";
  std::string error;  // why the rerun could not be made or did not finish ("" when it ran)
  std::vector<PrecisionDiff> diffs;  // every tensor the plain rerun recorded
  double cpu_seconds = 0.0;
  const PrecisionDiff* find(const std::string& name, const std::string& kind, int64_t step) const;
};

/// --tolerance auto: the noise of the plain step, measured by running it again from the same state
/// (once with another thread count, which regroups the CPU's parallel sums): per tensor, the
/// largest difference a rerun showed from the reference.
struct NoiseEnvelope {
  /// How many times a tensor's measured noise a checkpointed difference may reach and still count
  /// as noise: four reruns sample the noise, the checkpointed step is one more draw of it.
  static constexpr double kFactor = 4.0;
  int reruns = 0;
  std::vector<int> threads;  // each rerun's intra-op thread count
  struct Entry {
    std::string name;
    std::string kind;
    int64_t step = 1;
    double max_abs = 0.0;  // the largest difference a rerun showed (0: every rerun equal)
    double scale = 0.0;    // the reference's largest magnitude
  };
  std::vector<Entry> entries;  // every tensor of the reference
  /// The checkpointed step's tensors that differed from the reference within their noise (counted
  /// equal).
  std::vector<std::string> within;
  const Entry* find(const std::string& name, const std::string& kind, int64_t step) const;
};

/// Median of a sample (0 when empty).
double median(std::vector<double> values);

/// Everything one `run` records; optional parts only when a check asked for them.
struct RunRecords {
  StepRecord reference;
  StepRecord checkpointed;
  std::optional<StepRecord> fp32_reference;       // plain, autocast off (AMP study)
  std::optional<StepRecord> fp32_recompute;       // checkpointed, recompute in fp32 (AMP study)
  std::optional<std::vector<UnitProbe>> probes;   // determinism probe
  /// Units the determinism probe left alone: every call's recompute reproduced its forward
  /// bitwise and nothing changed their state in between (RunConfig::probe_every_unit is off).
  std::vector<std::string> reproduced_units;
  /// The process's CPU time of each part the records took ("reference", "checkpointed", "probe",
  /// ...), in the order they ran: what a check costs, and where.
  std::vector<std::pair<std::string, double>> cpu_seconds;
  /// The plain and checkpointed steps again under the interleaved schedule (two micro-batches,
  /// both forwards first), run when a checkpointed unit reads state the forward rewrites
  /// (CallEvidence::state_rewritten), and their tensors compared (the session fills the diffs).
  std::optional<StepRecord> interleaved_reference, interleaved_checkpointed;
  std::vector<TensorDiff> interleaved_diffs;
  std::optional<Measurement> bench_plain;         // run --bench: nothing checkpointed
  std::optional<Measurement> bench_checkpointed;  // run --bench: the plan
  std::optional<StepRecord> single_process;       // data-parallel: the whole batch in one process
  /// A second plain step from the same restored state, run when the checkpointed step differs:
  /// the tensors on which the two plain steps disagree (empty: the plain step repeats).
  std::optional<std::vector<std::string>> plain_not_repeated;
  /// --tolerance auto: the plain step's noise, measured when the checkpointed step differs.
  std::optional<NoiseEnvelope> noise;
  /// The float64 rerun, made when the checkpointed step differs (a single eager process with
  /// autocast off): nullopt when it was not made.
  std::optional<PrecisionRerun> precision;
  /// Data-parallel: what each rank saw (gathered on rank 0 before the checks run).
  struct Rank {
    int rank = 0;
    uint64_t rng_start = 0;
    bool draws = false;     // a checkpointed site consumed random numbers
    bool replayed = true;   // every such site's recompute reproduced its forward
    std::string error;
    std::string first_draw;  // the first checkpointed site that drew, "" when none
    /// Every random draw of the checkpointed calls' forwards: the site, the op, and its generator's
    /// state (two ranks with a state in common draw the same numbers there).
    struct Draw {
      std::string site, op;
      uint64_t state = 0;
    };
    std::vector<Draw> draws_at{};
  };
  std::vector<Rank> ranks;
  /// A model trained compiled (--compile): what the compiler did (Model::compiled_steps()).
  std::optional<CompiledSteps> compiled;
};

/// What the checks need beyond the two steps.
struct Needs {
  bool dtype_trace = false;  // op dtypes inside checkpointed calls (autocast check)
  bool probe = false;        // determinism probe
  bool amp_study = false;    // fp32 reference and fp32-recompute runs
  bool bench = false;        // memory and time of plain and checkpointed steps
  bool hooks = false;        // gradient hook counts of both steps
  bool single_process = false;  // data-parallel: a plain step on the whole batch, alone
  bool interleaved = false;     // the interleaved steps, where a unit reads state the forward rewrites
  Needs& operator|=(const Needs& o) {
    interleaved |= o.interleaved;
    dtype_trace |= o.dtype_trace;
    probe |= o.probe;
    amp_study |= o.amp_study;
    bench |= o.bench;
    hooks |= o.hooks;
    single_process |= o.single_process;
    return *this;
  }
};

/// Options of one recorded run.
struct StepOptions {
  bool evidence = true;  // record CallEvidence for every checkpointed call
  TraceLevel trace = TraceLevel::kNone;
  int64_t value_budget_bytes = 0;  // kFull: output copies kept for the op diff
  std::string value_site;          // kFull: only ops inside this site keep copies
  std::optional<Amp> amp;              // overrides RunConfig::amp
  std::optional<CheckpointProtections> checkpoint;  // overrides RunConfig::checkpoint
  bool count_hooks = false;  // count each parameter's gradient hook firings
  bool data_parallel = true;  // use RunConfig::data_parallel when there is one
  std::optional<Schedule> schedule;  // overrides RunConfig::schedule (other than sequential: 2 micro-batches at least)
  bool watch_rewrites = false;       // record CallEvidence::state_rewritten
};

/// What watches the steps Runner::measure_with runs (a memory profiler): told where each step
/// begins and ends.
class StepWatch {
 public:
  virtual ~StepWatch() = default;
  /// A step begins with `bytes` allocated; `measured`: it is one of the measured steps, not warm-up.
  virtual void step_begins(bool measured, int64_t bytes) {}
  /// The step's forward and backward are done: the most bytes above its start it allocated.
  virtual int64_t step_ends() = 0;
};

class Runner {
 public:
  /// The model's current state is the start of every run; the Runner puts it back when it ends.
  Runner(Model& model, RunConfig config);
  ~Runner();

  /// config.steps training steps from the start state with `plan`'s units checkpointed (all
  /// plain when `plan` is null). Never throws for a failure of the model or the checkpoint: the
  /// message is kept in StepRecord::error.
  StepRecord run(const Plan* plan, const StepOptions& options, const std::string& label);

  /// The reference and checkpointed steps plus whatever `needs` asks for.
  RunRecords run_all(const Plan& plan, const Needs& needs);
  /// The options of run_all's checkpointed step for the evidence `needs` asks for.
  StepOptions checkpointed_options(const Needs& needs) const;
  /// The interleaved steps (RunRecords::interleaved_*), where a call of r.checkpointed read state
  /// the forward rewrites; `plain`: the reference step's options.
  void run_interleaved(const Plan& plan, const StepOptions& plain, RunRecords& r);
  /// run --bench: plain and checkpointed steps measured in turn, into r.bench_plain and r.bench_checkpointed.
  void bench_alternating(const Plan& plan, RunRecords& r);

  /// Repeats each checkpointed unit on its forward inputs (see UnitProbe), step by step, in the
  /// grad mode the checkpoint under test runs its forward in (`no_grad`: a reentrant checkpoint),
  /// so that a unit is probed in the state it runs in when checkpointed. With `only`, the units
  /// whose labels it holds; the others run plainly.
  std::vector<UnitProbe> probe(const Plan& plan, bool no_grad = true, const std::set<std::string>* only = nullptr);

  /// `warmup` then `steps` training steps with `plan`'s units checkpointed (plain when null),
  /// measuring peak memory above the baseline and time; nothing is recorded, so nothing but the
  /// step itself allocates. Out of memory on a GPU is a result (fits = false), not an error.
  /// A rank of a data-parallel run measures its shard of the batch: `through_engine`, through the
  /// model's engine (FSDP2's sharded step), else the whole module alone.
  Measurement measure(const Plan* plan, int64_t warmup, int64_t steps, bool through_engine = false);
  /// measure() through any site runner (a profiler's), with a watch told where each step begins and ends.
  Measurement measure_with(SiteRunner& sites, int64_t warmup, int64_t steps, StepWatch* watch,
                           bool through_engine = false);

  /// The plain step and the checkpointed step under `plan` again, with every floating parameter,
  /// state tensor and input of the model converted to float64 (put back as they were afterwards),
  /// compared tensor by tensor. Never throws: what stopped it is PrecisionRerun::error.
  PrecisionRerun rerun_in_float64(const Plan& plan);

  const RunConfig& config() const { return config_; }
  Model& model() { return model_; }

 private:
  Model& model_;
  RunConfig config_;
  ModelState start_;
};

}  // namespace ckcheck
