// Reading the Runner's evidence: which checkpointed site explains a difference, and why. The
// symptom checks (gradients, buffers) use it to name the cause of what they see.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checks/check.h"

namespace ckcheck {

struct SiteExplanation {
  std::string site;
  Cause cause = Cause::kNonDeterministic;
  std::string evidence;  // one sentence
  std::string hint{};    // the fix where the cause's own hint does not fit ("" otherwise)
};

/// The fix for random ops that a compiled backward recomputes with new random numbers.
extern const char* const kCompiledRngHint;

/// The probe of a unit, if the probe ran.
const UnitProbe* probe_for(const CheckContext& ctx, const std::string& site);

/// When the generators outside torch the unit drew from alone explain why its second call computes
/// something else (it repeats from a restart that puts them back, and changed no state of the
/// model): the sentence that says so, naming them ("the site draws from NumPy's global generator
/// (numpy.random), which no checkpoint ..."); "" otherwise.
std::string host_generator_draws(const UnitProbe* probe);

/// The fix for a unit that draws from generators outside torch.
extern const char* const kHostGeneratorHint;

/// When the unit's first call changed what it is handed (a list it appends to, a cache object
/// whose attributes it rebinds): the sentence that names those arguments; "" otherwise.
std::string handed_state_change(const UnitProbe& probe);

/// The fix for a unit that changes what it is handed.
extern const char* const kHandedStateHint;

/// The fix for a site whose arguments (a list it is handed) were consumed or refilled between its
/// forward and its recompute.
extern const char* const kConsumedArgumentsHint;

/// The cause of a recompute in other dtypes than its forward: recompute-dtype where the engine
/// casts the parameters (FSDP2's mixed precision) and AMP is off, else autocast.
Cause dtype_cause(const CheckContext& ctx);

/// The first op of a recomputed call that ran under another autocast state, in another dtype, or
/// as a cast the other run lacks, than in its forward. Nothing when the two runs agree up to where
/// one of them ends or takes another op, not a cast, under the same autocast state (another path,
/// not another precision).
std::optional<size_t> first_dtype_difference(const CallEvidence& call);

/// recompute-collective: the recompute issued other collectives than its forward. Brought by the
/// collectives check.
extern const Cause kRecomputeCollective;

/// Where a call's recompute issued other collectives than its forward: the first position where
/// the two ledgers part, with what each holds there ("" past its end).
struct CollectiveParting {
  size_t at = 0;
  std::string forward, recompute;
};
std::optional<CollectiveParting> collective_parting(const CallEvidence& call);

/// In words: the recompute dropped, added or changed (group, tensors) that collective.
std::string collective_parting_words(const CallEvidence& call, const CollectiveParting& parting);

/// precision-context: the recompute ran outside the precision or quantization context its forward
/// ran under (float8 training, a quantized layer's switch). Brought by the autocast check.
extern const Cause kPrecisionContext;

/// Where a call's recompute made a reduced-precision op (at any depth: inside a float8 layer's
/// autograd Function too) more or fewer times than its forward: the op and its dtypes. Only ops of
/// a reduced precision tell a precision context: a cast to float32 alone is another path (a kernel
/// chosen by grad mode), which the other causes judge.
struct PrecisionShift {
  std::string op;           // "aten::_to_copy -> Float8_e4m3fn"
  size_t forward = 0;       // how often the forward made it
  size_t recompute = 0;     // and the recompute
};

/// The first such op of the forward the recompute made less often, else the first of the
/// recompute the forward made less often; nothing when both made the same ones as often (or the
/// call was not traced or not recomputed).
std::optional<PrecisionShift> precision_shift(const CallEvidence& call);

/// The sentence that says what a precision shift means.
std::string precision_shift_words(const PrecisionShift& shift);

/// The first random draw of a call's recompute that its forward never made -- another op, or the
/// same op from another generator state: there the recompute drew other numbers than its forward.
/// Null when every draw of the recompute replays one of the forward's (or none was seen).
const RandomDraw* unreplayed_draw(const CallEvidence& call);

/// Why the recompute made `draw`, in words: from a generator of its own; from the state its
/// forward's other op drew from (it skipped a draw: a random op a selective checkpoint saved); with
/// the RNG state not preserved; or from another state than any draw of its forward.
std::string unreplayed_draw_words(const CallEvidence& call, const RandomDraw& draw, bool preserve_rng_state);

/// The fix for a recompute that skipped a draw its forward made (a random op a selective
/// checkpoint saved); "" for the other ways (their cause's own fix fits).
std::string unreplayed_draw_hint(const CallEvidence& call, const RandomDraw& draw);

/// True when a call's recompute did not reproduce its forward outputs bitwise.
bool recompute_differs(const CallEvidence& call);

/// The unit draws from a generator of its own (its probe says so) and state it holds ends the
/// checkpointed step elsewhere than the plain step's: its recompute drew again. Evidence where the
/// unit's outputs cannot show it -- selective checkpointing hands back the forward's outputs of the
/// ops it saved, while the ops it recomputed with the new numbers feed the backward.
bool private_generator_drew_again(const CheckContext& ctx, const std::string& site);

/// For every checkpointed unit whose evidence shows a hazard, its cause, in plan order.
/// The state a call saw changed before its recompute, in words: each name, and "(shared by N
/// sites)" after one the model reaches through several module paths.
std::string changed_state_names(const CallEvidence& c);

std::vector<SiteExplanation> explain_sites(const CheckContext& ctx);

/// When the plain step's outputs that carried a graph lost it with checkpointing while a
/// checkpointed forward ran without autograd (a reentrant checkpoint): the unit whose forward ran
/// so (`tensor`'s own unit when it is one of them) and the outputs that lost their graph.
std::optional<SiteExplanation> graph_lost_in_no_grad_forward(const CheckContext& ctx, const std::string& tensor);

/// For a step whose every recompute reproduced its forward and whose gradient still differs: when
/// a checkpointed forward ran without autograd (a reentrant checkpoint) and every parameter's
/// gradient hook fired as in the plain step (counted; a hook that changes gradients and fires
/// again is the other way such a step differs), what was lost is the graph of a tensor computed
/// inside the forward and used outside it (an auxiliary loss the model collects, features kept by a
/// hook), whose value is the same with and without checkpointing. The unit as above.
std::optional<SiteExplanation> kept_from_no_grad_forward(const CheckContext& ctx, const std::string& tensor);

/// How many epsilons of a tensor's own largest value a different summation order may move it (the
/// reordering error of a sum of up to ~500 terms), where no float64 rerun tells.
constexpr double kReassociationEps = 1024.0;
constexpr double kFloat64Epsilon = 2.220446049250313e-16;

/// How one differing tensor stands against rounding.
struct TensorRounding {
  bool rounding = false;
  /// "float64": the float64 rerun's difference against the float32 one times the square root of
  /// the precisions' ratio (rounding shrinks by the whole ratio, ~2e-9 from float32; a lost or
  /// changed contribution keeps its size); "own-scale": within kReassociationEps epsilons of the
  /// tensor's own largest value; "none": not a value rounding can explain (state, a missing side).
  std::string rule;
  double measured = 0.0;  // the difference as the step measured it
  double float64 = 0.0;   // the float64 rerun's (rule "float64")
  double bound = 0.0;
};
TensorRounding tensor_rounding(const CheckContext& ctx, const TensorDiff& d);

/// Whether checkpointing changed only the order in which the same contributions were summed, with
/// the evidence in words. Rounding needs: no site-level evidence, every recompute reproduced its
/// forward bitwise, and every differing tensor (state aside) rounding by tensor_rounding -- by the
/// float64 rerun where it ran (the loss and outputs then too), else on its own scale (compiled,
/// the loss and outputs on theirs: the compiler's kernels for the checkpointed step are others).
/// A reentrant checkpoint runs a separate backward per checkpointed call and adds each call's
/// part to .grad on its own: rounding. A contribution it loses (an auxiliary loss computed in a
/// forward run without autograd) keeps its size in float64: not rounding.
struct RoundingEvidence {
  bool rounding = false;
  std::string rule;      // "float64" when the rerun showed every difference, else "own-scale"
  std::string sentence;  // the rule and what it measured; for no rounding, the tensor that refutes it
  std::string against;   // that tensor ("" when rounding, or when no tensor was measured)
  nlohmann::json details;
};
RoundingEvidence rounding_evidence(const CheckContext& ctx, const std::vector<SiteExplanation>& explained);
/// rounding_evidence(...).rounding.
bool rounding_only(const CheckContext& ctx, const std::vector<SiteExplanation>& explained);

/// The checkpointed unit a tensor belongs to ("blocks.1.bn1.running_mean" -> "blocks.1"), or "".
std::string owning_unit(const Plan& plan, const std::string& tensor_name);

/// How often the plain step fired the gradient hook counted in `checkpointed` (at the same point,
/// HookCount::same_point); 1 when the plain step did not count it.
int64_t plain_fires(const CheckContext& ctx, const HookCount& checkpointed);

/// Whether the hook counted in `checkpointed` marks its parameter as the plain step does for
/// data-parallel training: it fires as often, or it fires once without a gradient where the plain
/// step never reached it (a parameter whose result the loss does not use, reached through a
/// checkpoint's node that returns no gradient for it): DDP takes both as an unused parameter.
bool fires_as_plain(const CheckContext& ctx, const HookCount& checkpointed);

}  // namespace ckcheck
