// Recording the ATen ops a step executes, through LibTorch's RecordFunction callbacks, with the
// site and phase (forward, recompute, backward) each one ran in. Only diagnosis and the checks
// that need op-level evidence turn it on; a plain `ckcheck run` records nothing.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ckcheck {

enum class TraceLevel {
  kNone,    // nothing recorded
  kNames,   // op names, random-number use, generator arguments
  kDtypes,  // + output shapes and dtypes
  kFull,    // + content fingerprints, non-finite flags and (within a byte budget) output copies
};

enum class Phase { kForward, kRecompute, kBackward };
const char* phase_name(Phase phase);

struct OpRecord {
  int64_t index = 0;  // position in the trace, in the order ops started
  std::string name;   // "aten::log"; in the backward, the ATen op run by `node`
  int depth = 0;      // nesting among recorded ops; 0 for an op called by the model itself
  Phase phase = Phase::kForward;
  std::string site;   // innermost site running ("" outside every site)
  int64_t call = -1;  // the checkpoint call it ran inside, -1 if none
  std::string node;   // backward: the autograd node being run ("LogBackward0")
  int64_t seq_nr = -1;
  std::vector<std::vector<int64_t>> shapes;  // of the tensor outputs
  std::vector<std::string> dtypes;
  int64_t output_bytes = 0;    // of the tensor outputs that are not views (kDtypes and above)
  double seconds = 0.0;        // from its start to its end, the ops it called included
  bool composite = false;      // CompositeImplicitAutograd: decomposed above autograd, so an op-level
                               // checkpoint policy sees the ops it calls, never it (kDtypes and above)
  std::string autocast;  // autocast state the op was called under: "off", "cpu:BFloat16", ...
  std::vector<uint64_t> fingerprints;
  bool nonfinite = false;          // an output holds NaN or Inf
  bool nan = false;                // an output holds NaN
  bool random = false;             // draws random numbers
  bool private_generator = false;  // was given a generator other than its device's default
  std::vector<torch::Tensor> values;  // output copies (kFull, within the budget)
};

/// Records ops while alive (one tracer at a time per process). The runner tells it where the
/// step is (site stack, phase, checkpoint call) as it goes.
class OpTracer {
 public:
  /// `value_budget_bytes`: how many bytes of output copies to keep (kFull only); copies are only
  /// kept for ops inside `value_site` (or everywhere when it is empty).
  /// `skipped_scopes`: prefixes of record_function scopes whose ops are not the model's (a
  /// data-parallel engine's own work): ops run inside them are not recorded.
  explicit OpTracer(TraceLevel level, int64_t value_budget_bytes = 0, std::string value_site = "",
                    std::vector<std::string> skipped_scopes = {});
  ~OpTracer();
  OpTracer(const OpTracer&) = delete;
  OpTracer& operator=(const OpTracer&) = delete;

  void push_site(const std::string& site, int64_t call = -1);
  void pop_site();
  void set_phase(Phase phase);
  Phase phase() const;
  TraceLevel level() const { return level_; }

  /// The records so far, leaving the tracer empty.
  std::vector<OpRecord> take();

  struct Impl;

 private:
  TraceLevel level_;
  std::unique_ptr<Impl> impl_;
};

/// True for ATen ops that draw random numbers (bernoulli_, rand, normal_, native_dropout, ...).
bool is_random_op(const std::string& name);

/// True for the ops through which a dtype changes: casts by hand (.to, .float(), type_as) and
/// autocast's own.
bool is_cast_op(const std::string& name);

/// True for a dtype (c10's name: "BFloat16", "Float8_e4m3fn", "QInt8") of reduced floating or
/// quantized precision: what a precision context (AMP, float8 training, a quantized layer) produces.
bool is_reduced_precision(const std::string& dtype);

/// One random op run inside a checkpointed call, with the state of the generator it draws from as
/// it began: two draws with the same op and state draw the same numbers.
struct RandomDraw {
  std::string op;                  // "aten::bernoulli_"
  uint64_t state = 0;              // fingerprint of its generator's state as the op began
  bool private_generator = false;  // it was given a generator other than its device's default
  bool operator==(const RandomDraw& o) const { return op == o.op && state == o.state; }
};

/// Where a DrawWatch records: the random draws, and the collectives and point-to-point operations
/// (c10d's ops: "c10d::allreduce_ 8x16 Float") issued on this thread.
struct DrawTargets {
  std::vector<RandomDraw>* draws = nullptr;
  std::vector<std::string>* collectives = nullptr;
};

/// Records the random ops that run on this thread while it lives (a checkpointed call's forward,
/// or its recompute), each with its generator's state as it begins: the default generator of the
/// op's device, or the one it was given; and the collectives issued. Watches nest; the innermost
/// records. A RecordFunction callback with inputs, on this thread only, for the watch's life.
class DrawWatch {
 public:
  explicit DrawWatch(std::vector<RandomDraw>& draws, std::vector<std::string>* collectives = nullptr);
  ~DrawWatch();
  DrawWatch(const DrawWatch&) = delete;
  DrawWatch& operator=(const DrawWatch&) = delete;

 private:
  std::vector<RandomDraw>* target_;
};

/// True for c10d's collectives and point-to-point operations ("c10d::allreduce_", "c10d::send").
bool is_collective_op(const std::string& name);

}  // namespace ckcheck
