#include "checks/evidence.h"

#include "checks/common.h"

#include <fmt/ranges.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace ckcheck {

const UnitProbe* probe_for(const CheckContext& ctx, const std::string& site) {
  if (!ctx.records.probes) return nullptr;
  for (const auto& p : *ctx.records.probes) {
    if (p.site == site) return &p;
  }
  return nullptr;
}

std::string host_generator_draws(const UnitProbe* probe) {
  if (probe == nullptr || probe->host_generators.empty() || probe->repeat_equal || !probe->restart_equal ||
      !probe->changed_state.empty() || probe->private_generator) {
    return "";
  }
  std::vector<std::string> words;
  for (const auto& g : probe->host_generators) {
    words.push_back(g == "numpy.random" ? "NumPy's global generator (numpy.random)"
                    : g == "random"     ? "Python's random module"
                                        : fmt::format("the generator it keeps ({})", g));
  }
  return fmt::format("the site draws from {}, which no checkpoint saves or replays, so its recompute draws other "
                     "numbers than the forward",
                     fmt::join(words, " and "));
}

const char* const kHostGeneratorHint =
    "draw the random numbers with torch (torch.rand, torch.randn, torch.bernoulli: the checkpoint replays "
    "torch's RNG state), or draw them outside the checkpointed segment and pass them in";

std::string handed_state_change(const UnitProbe& probe) {
  if (probe.handed_state.empty()) return "";
  return fmt::format("the site changes what it is handed ({}) on every call (a cache it appends to, a list it "
                     "pops from), so the recompute finds it changed and computes something else than the forward",
                     fmt::join(probe.handed_state, ", "));
}

const char* const kConsumedArgumentsHint =
    "do not consume or refill what a checkpointed site is handed (pop from a list, assign into a dict): hand it a "
    "tuple, or a copy it may change";

const char* const kHandedStateHint =
    "keep what the unit changes of its arguments out of the checkpointed step: turn the cache off while training "
    "(use_cache=False for a Hugging Face model), hand it a tuple or a copy rather than a list it pops from, or "
    "leave this unit out of checkpointing";

Cause dtype_cause(const CheckContext& ctx) {
  return ctx.config.amp == Amp::kOff && engine_mixed_precision(ctx.config.data_parallel) != "off" ? Cause::kRecomputeDtype
                                                                                                  : Cause::kAutocast;
}

std::optional<size_t> first_dtype_difference(const CallEvidence& c) {
  if (c.forward_dtypes.empty() && c.recompute_dtypes.empty()) return std::nullopt;
  if (!c.recomputed) return std::nullopt;
  const size_t n = std::min(c.forward_dtypes.size(), c.recompute_dtypes.size());
  auto at = [](const std::vector<std::string>& v, size_t i) { return i < v.size() ? v[i] : std::string(); };
  for (size_t i = 0; i < n; ++i) {
    if (at(c.forward_autocast, i) != at(c.recompute_autocast, i)) return i;
    if (c.forward_ops[i] != c.recompute_ops[i]) {
      // A cast in one run and not the other is another precision (a recompute that upcasts); any
      // other op under the same autocast state is another path (a cache the forward filled, a
      // branch on state), past which the runs no longer line up: the other checks judge it.
      if (is_cast_op(c.forward_ops[i]) || is_cast_op(c.recompute_ops[i])) return i;
      return std::nullopt;
    }
    // An op that threw has no output dtype ("-"): that alone is not a dtype change.
    const bool threw = c.recompute_failed && i + 1 == c.recompute_dtypes.size();
    if (!threw && c.forward_dtypes[i] != c.recompute_dtypes[i]) return i;
  }
  return std::nullopt;
}


std::optional<CollectiveParting> collective_parting(const CallEvidence& c) {
  const auto& f = c.forward_collectives;
  const auto& r = c.recompute_collectives;
  if (!c.recomputed || f == r) return std::nullopt;
  const auto [fi, ri] = std::mismatch(f.begin(), f.end(), r.begin(), r.end());
  CollectiveParting p;
  p.at = static_cast<size_t>(fi - f.begin());
  p.forward = fi == f.end() ? "" : *fi;
  p.recompute = ri == r.end() ? "" : *ri;
  return p;
}

std::string collective_parting_words(const CallEvidence& c, const CollectiveParting& p) {
  const auto where = fmt::format("collective {} of the site", p.at);
  if (p.recompute.empty()) {
    return fmt::format("the recompute dropped {} -- {}, which the forward issued (the forward issued {}, the "
                       "recompute {})",
                       where, p.forward, c.forward_collectives.size(), c.recompute_collectives.size());
  }
  if (p.forward.empty()) {
    return fmt::format("the recompute issued {} -- {}, which the forward did not (the forward issued {}, the "
                       "recompute {})",
                       where, p.recompute, c.forward_collectives.size(), c.recompute_collectives.size());
  }
  return fmt::format("{} is {} in the forward but {} in the recompute", where, p.forward, p.recompute);
}

std::optional<PrecisionShift> precision_shift(const CallEvidence& c) {
  if (!c.recomputed || (c.forward_precision_ops.empty() && c.recompute_precision_ops.empty())) return std::nullopt;
  std::map<std::string, size_t> forward, recompute;
  for (const auto& op : c.forward_precision_ops) ++forward[op];
  for (const auto& op : c.recompute_precision_ops) ++recompute[op];
  for (const auto& op : c.forward_precision_ops) {
    if (forward[op] > recompute[op]) return PrecisionShift{op, forward[op], recompute[op]};
  }
  for (const auto& op : c.recompute_precision_ops) {
    if (recompute[op] > forward[op]) return PrecisionShift{op, forward[op], recompute[op]};
  }
  return std::nullopt;
}

std::string precision_shift_words(const PrecisionShift& s) {
  auto times = [](size_t n) { return n == 0 ? std::string("never") : count_of(n, "time"); };
  return fmt::format("the forward ran {} {}, the recompute {}: the recompute ran outside the precision or "
                     "quantization context its forward ran under (float8 training, a quantized layer's switch) "
                     "and recomputed other values",
                     s.op, times(s.forward), times(s.recompute));
}

bool recompute_differs(const CallEvidence& c) {
  for (const auto& d : c.output_diffs) {
    if (!d.equal) return true;
  }
  return false;
}

std::string changed_state_names(const CallEvidence& c) {
  std::vector<std::string> names;
  for (const auto& name : c.state_changed) {
    auto it = c.state_paths.find(name);
    names.push_back(it == c.state_paths.end() ? name : fmt::format("{} (shared by {} sites)", name, it->second));
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

const char* const kCompiledRngHint =
    "keep random ops out of what the compiler recomputes: raise the memory budget, save their outputs (a SAC "
    "policy that saves them), or move dropout outside the compiled region";

namespace {

// The plan's unit a module path belongs to ("blocks.0.drop" -> "blocks.0"), else the path itself.
std::string unit_of_path(const Plan& plan, const std::string& path) {
  for (const auto& unit : plan.units) {
    for (const auto& site : unit) {
      if (site_within(path, site)) return Plan::unit_label(unit);
    }
  }
  return path.empty() ? "(compiled graph)" : path;
}

// Compiled: the units whose random ops the compiled backward runs again with new random numbers.
std::vector<SiteExplanation> explain_compiled(const CheckContext& ctx) {
  std::vector<SiteExplanation> out;
  for (const auto& op : ctx.records.compiled->recomputed_random) {
    const auto site = unit_of_path(ctx.plan, op.site);
    auto it = std::find_if(out.begin(), out.end(), [&](const SiteExplanation& e) { return e.site == site; });
    const auto what = op.source.empty() ? op.op : fmt::format("{} ({})", op.source, op.op);
    if (it != out.end()) {
      it->evidence += fmt::format("; and {}", what);
      continue;
    }
    out.push_back({site, Cause::kRng,
                   fmt::format("the compiled backward recomputes a random op with new random numbers (it draws its "
                               "own seeds), so the recompute's mask differs from the forward's: {}",
                               what),
                   kCompiledRngHint});
  }
  return out;
}

}  // namespace

bool private_generator_drew_again(const CheckContext& ctx, const std::string& site) {
  const UnitProbe* probe = probe_for(ctx, site);
  if (!probe || !probe->private_generator) return false;
  return std::any_of(ctx.diffs.begin(), ctx.diffs.end(), [&](const TensorDiff& d) {
    return !d.equal && d.kind == state_kind::kExtra && site_within(state_display_name(d.name), site);
  });
}

const RandomDraw* unreplayed_draw(const CallEvidence& call) {
  for (const auto& d : call.recompute_draws) {
    if (std::find(call.forward_draws.begin(), call.forward_draws.end(), d) == call.forward_draws.end()) return &d;
  }
  return nullptr;
}

std::string unreplayed_draw_words(const CallEvidence& call, const RandomDraw& draw, bool preserve_rng_state) {
  if (draw.private_generator) {
    return fmt::format("the recompute's {} draws from a generator passed to it, whose state no checkpoint saves or "
                       "restores, so it draws other numbers than in the forward", draw.op);
  }
  const auto same_state = std::find_if(call.forward_draws.begin(), call.forward_draws.end(),
                                       [&](const RandomDraw& f) { return f.state == draw.state; });
  if (same_state != call.forward_draws.end()) {
    return fmt::format("the recompute's {} drew from the RNG state its forward's {} drew from: the recompute skipped "
                       "a draw its forward made ({} of the forward's {} draws ran again; a random op a selective "
                       "checkpoint saved is not run again), so the draws after it take other numbers",
                       draw.op, same_state->op, call.recompute_draws.size(), call.forward_draws.size());
  }
  if (!preserve_rng_state) {
    return fmt::format("the recompute's {} draws other numbers than in the forward: the RNG state is not preserved",
                       draw.op);
  }
  return fmt::format("the recompute's {} draws from another RNG state than any draw of its forward, so it draws "
                     "other numbers (the state the recompute ran under is not the forward's)", draw.op);
}

std::string unreplayed_draw_hint(const CallEvidence& call, const RandomDraw& draw) {
  const bool skipped = !draw.private_generator &&
                       std::any_of(call.forward_draws.begin(), call.forward_draws.end(),
                                   [&](const RandomDraw& f) { return f.state == draw.state; });
  return skipped ? "save every random op of the segment in the op policy, or none of them (a saved random op is "
                   "not drawn again, which shifts the draws after it): e.g. return MUST_RECOMPUTE for aten random "
                   "ops in the policy function"
                 : "";
}

namespace {

// Every input the call changed in place, by when: during the site's forward, after it, or unseen by
// autograd (content only); nothing when none was.
std::optional<SiteExplanation> changed_inputs(const std::string& site, const CallEvidence& c) {
  if (c.recomputed && c.inputs_recompute != c.inputs_forward) return std::nullopt;  // positions no longer match
  std::vector<size_t> during, after, untracked;
  for (size_t i = 0; i < c.versions_entry.size(); ++i) {
    if (i < c.versions_exit.size() && c.versions_exit[i] != c.versions_entry[i]) {
      during.push_back(i);
    } else if (i < c.versions_recompute.size() && i < c.versions_exit.size() && c.versions_recompute[i] != c.versions_exit[i]) {
      after.push_back(i);
    } else if (i < c.content_changed.size() && c.content_changed[i]) {
      untracked.push_back(i);
    }
  }
  auto inputs = [](const std::vector<size_t>& v) {
    return fmt::format("{} {}", v.size() == 1 ? "input" : "inputs", fmt::join(v, ", "));
  };
  std::vector<std::string> parts;
  if (!during.empty()) parts.push_back(fmt::format("the site changes its {} in place", inputs(during)));
  if (!after.empty()) parts.push_back(fmt::format("{} changed in place after the site's forward", inputs(after)));
  if (!untracked.empty()) parts.push_back(fmt::format("{}: content changed before the recompute", inputs(untracked)));
  if (parts.empty()) return std::nullopt;
  return SiteExplanation{site, Cause::kInPlace, fmt::format("{}", fmt::join(parts, "; "))};
}

// The random numbers a recompute drew otherwise than its forward, if that explains it.
std::optional<SiteExplanation> random_cause(const CheckContext& ctx, const std::string& site, const CallEvidence& c,
                                            const UnitProbe* probe) {
  if (probe && probe->private_generator) {
    return SiteExplanation{site, Cause::kRng, "the site draws from its own torch::Generator, which no checkpoint restores"};
  }
  if (const auto* draw = unreplayed_draw(c)) {
    return SiteExplanation{site, Cause::kRng, unreplayed_draw_words(c, *draw, ctx.config.checkpoint.preserve_rng_state),
                           unreplayed_draw_hint(c, *draw)};
  }
  if (c.rng_consumed && (!ctx.config.checkpoint.preserve_rng_state || !c.rng_replayed)) {
    return SiteExplanation{site, Cause::kRng, "the site draws random numbers and the RNG state is not preserved"};
  }
  return std::nullopt;
}

// What the probe of the site says: state it keeps, non-determinism, or values that depend on grad mode.
std::optional<SiteExplanation> probed_cause(const std::string& site, const CallEvidence& c, const UnitProbe* probe) {
  if (!probe) return std::nullopt;
  if (!probe->repeat_equal && probe->restart_equal && !probe->handed_state.empty()) {
    return SiteExplanation{site, Cause::kStateful, handed_state_change(*probe), kHandedStateHint};
  }
  if (!probe->repeat_equal && probe->restart_equal) {
    return SiteExplanation{site, Cause::kStateful, "the site changes its own state, so the recompute computes something else"};
  }
  if (!probe->restart_equal) {
    return SiteExplanation{site, Cause::kNonDeterministic, "the site gives different outputs on identical inputs"};
  }
  if (!probe->grad_mode_equal && c.forward_no_grad) {
    return SiteExplanation{site, Cause::kGradMode,
                           fmt::format("the site computes other values with autograd on than off (by {:.3g}), "
                                       "and its forward ran without autograd while its recompute ran with it",
                                       probe->grad_mode_diff)};
  }
  return std::nullopt;
}

// Why the call's recompute did not reproduce its forward, in the order the evidence is trusted.
std::optional<SiteExplanation> explain_call(const CheckContext& ctx, const std::string& site, const CallEvidence& c,
                                            const UnitProbe* probe) {
  if (auto changed = changed_inputs(site, c)) return changed;
  if (!(recompute_differs(c) || c.recompute_failed || private_generator_drew_again(ctx, site))) return std::nullopt;
  if (auto parted = collective_parting(c)) {
    return SiteExplanation{site, kRecomputeCollective,
                           collective_parting_words(c, *parted) + ", so it recomputed from other data than the forward"};
  }
  if (!c.state_poisoned.empty()) {
    return SiteExplanation{site, Cause::kInPlace,
                           fmt::format("{} -- state the model's forward rewrites before the site runs -- {} overwritten "
                                       "with NaN after the site's forward (--poison), and the backward read {}: any "
                                       "forward run before this backward (the next micro-batch's) changes what it reads",
                                       fmt::join(c.state_poisoned, ", "), c.state_poisoned.size() == 1 ? "was" : "were",
                                       c.state_poisoned.size() == 1 ? "it" : "them"),
                           "keep what a checkpointed site reads fixed until its backward: allocate it per micro-batch "
                           "or pass it as an argument; else do not checkpoint the site"};
  }
  if (!c.state_changed.empty()) {
    return SiteExplanation{site, Cause::kInPlace,
                           fmt::format("{} was changed after the site's forward and before its recompute, so the "
                                       "recompute read the new value",
                                       changed_state_names(c))};
  }
  if (auto random = random_cause(ctx, site, c, probe)) return random;
  if (first_dtype_difference(c)) {
    return SiteExplanation{site, dtype_cause(ctx), "the recompute runs its ops in other dtypes than the forward"};
  }
  if (auto host = host_generator_draws(probe); !host.empty()) {
    return SiteExplanation{site, Cause::kRng, std::move(host), kHostGeneratorHint};
  }
  if (auto probed = probed_cause(site, c, probe)) return probed;
  if (auto shift = precision_shift(c)) return SiteExplanation{site, kPrecisionContext, precision_shift_words(*shift)};
  if (c.recomputed && c.inputs_recompute != c.inputs_forward) {  // changed by someone else than the site
    return SiteExplanation{site, Cause::kInPlace,
                           fmt::format("the site's arguments hold {} input tensors at its forward and {} at its "
                                       "recompute (a list it is handed was consumed or refilled in between)",
                                       c.inputs_forward, c.inputs_recompute),
                           kConsumedArgumentsHint};
  }
  if (c.recompute_failed) return std::nullopt;  // no evidence: the step's verdict is error
  // Never non-deterministic without a failing determinism probe: say that nothing explains it.
  return SiteExplanation{site, Cause::kUnexplained,
                         "the recompute did not reproduce the forward's outputs, and no check found why (the "
                         "site repeats identically on its own)"};
}

}  // namespace

std::vector<SiteExplanation> explain_sites(const CheckContext& ctx) {
  if (ctx.records.compiled) return explain_compiled(ctx);
  std::vector<SiteExplanation> out;
  for (const auto& unit : ctx.plan.units) {
    const auto site = Plan::unit_label(unit);
    const UnitProbe* probe = probe_for(ctx, site);
    for (const auto& c : ctx.records.checkpointed.calls) {
      if (c.site != site) continue;
      if (auto found = explain_call(ctx, site, c, probe)) {
        out.push_back(*found);
        break;
      }
    }
  }
  return out;
}

std::string owning_unit(const Plan& plan, const std::string& name) {
  const std::string tensor = state_display_name(name);
  for (const auto& unit : plan.units) {
    for (const auto& site : unit) {
      if (site_within(tensor, site)) return Plan::unit_label(unit);
    }
  }
  return "";
}

int64_t plain_fires(const CheckContext& ctx, const HookCount& h) {
  int64_t plain = 1;
  for (const auto& p : ctx.records.reference.hooks) {
    if (p.same_point(h)) plain = p.fires;
  }
  return plain;
}

bool fires_as_plain(const CheckContext& ctx, const HookCount& h) {
  const int64_t plain = plain_fires(ctx, h);
  return h.fires == plain || (plain == 0 && h.fires == 1 && h.fires_without_gradient == 1);
}

namespace {

// Machine epsilon of a floating-point tensor's dtype (0 for others).
double epsilon_of(const torch::Tensor& t) { return machine_epsilon(t.scalar_type()); }

bool is_gradient(const std::string& kind) {
  return kind.rfind("param-grad", 0) == 0 || kind == "input-grad";  // and the kinds of param-grad (partial sums)
}

// The unit whose checkpointed forward ran without autograd: `tensor`'s own unit when it is one of
// them, else the first ("" when none did).
std::string no_grad_forward_site(const CheckContext& ctx, const std::string& tensor) {
  const auto own = owning_unit(ctx.plan, tensor);
  std::string site;
  for (const auto& c : ctx.records.checkpointed.calls) {
    if (c.forward_no_grad && (site.empty() || c.site == own)) site = c.site;
  }
  return site;
}

}  // namespace

std::optional<SiteExplanation> graph_lost_in_no_grad_forward(const CheckContext& ctx, const std::string& tensor) {
  std::vector<std::string> lost;
  for (const auto& t : ctx.records.reference.tensors) {
    if (t.kind != "output" || !t.requires_grad) continue;
    const auto* other = ctx.records.checkpointed.find(t.name, t.kind, t.step);
    if (other && !other->requires_grad) lost.push_back(t.name);
  }
  if (lost.empty()) return std::nullopt;
  const auto site = no_grad_forward_site(ctx, tensor);
  if (site.empty()) return std::nullopt;
  return SiteExplanation{site, Cause::kReentrantNoGrad,
                         fmt::format("{} {} a graph without checkpointing and none with it: the checkpointed forward "
                                     "ran without autograd, so what was kept from inside it has no gradient",
                                     fmt::join(lost, ", "), lost.size() == 1 ? "has" : "have")};
}

std::optional<SiteExplanation> kept_from_no_grad_forward(const CheckContext& ctx, const std::string& tensor) {
  const auto& hooks = ctx.records.checkpointed.hooks;
  const bool alike = !hooks.empty() && std::all_of(hooks.begin(), hooks.end(), [&](const HookCount& h) {
    return fires_as_plain(ctx, h);
  });
  const auto site = alike ? no_grad_forward_site(ctx, tensor) : std::string();
  if (site.empty()) return std::nullopt;
  return SiteExplanation{site, Cause::kReentrantNoGrad,
                         fmt::format("every recompute reproduced its forward bitwise, yet {} differs, and the "
                                     "checkpointed forward ran without autograd: a tensor computed inside it and used "
                                     "outside (an auxiliary loss collected in a list, features kept by a hook) has "
                                     "no graph, so no gradient flows back through it",
                                     tensor)};
}

namespace {

// The loss is kept in double; it was computed in the outputs' precision.
double output_epsilon(const CheckContext& ctx) {
  double eps = 0.0;
  for (const auto& t : ctx.records.reference.tensors) {
    if (t.kind == "output" && t.value.defined() && t.value.is_floating_point()) eps = std::max(eps, epsilon_of(t.value));
  }
  return eps;
}

// The float64 rerun when it ran to the end.
const PrecisionRerun* rerun_of(const CheckContext& ctx) {
  const auto& p = ctx.records.precision;
  return p && p->error.empty() ? &*p : nullptr;
}

// Why there is no float64 evidence, in words.
std::string no_rerun_reason(const CheckContext& ctx) {
  if (ctx.records.precision) return "the float64 rerun could not be made (" + ctx.records.precision->error + ")";
  if (ctx.records.compiled) return "no float64 rerun of a compiled model";
  if (ctx.config.amp != Amp::kOff) return "no float64 rerun under autocast";
  return "no float64 rerun";
}

// Why a difference is no rounding, in words.
std::string against_sentence(const TensorDiff& d, const TensorRounding& t, const std::string& no_rerun) {
  if (t.rule == "float64") {
    return fmt::format("rerun in float64, {} still differs by {:.3g} ({:.3g} in float32), where rounding would have "
                       "shrunk below {:.3g} with the precision: a real difference, not summation order",
                       d.name, t.float64, d.max_abs, t.bound);
  }
  if (t.rule == "own-scale") {
    return fmt::format("{}; {} differs by {:.3g}, {:.3g} times the reordering error a sum of its own size allows "
                       "({:.3g}, {:g} epsilons of its largest value): a real difference",
                       no_rerun, d.name, d.max_abs, t.bound > 0 ? d.max_abs / t.bound : 0.0, t.bound, kReassociationEps);
  }
  return "";
}

// Why every difference is rounding, in words.
std::string for_sentence(const TensorDiff& worst, const TensorRounding& t, size_t by_rerun, size_t differing,
                         const std::string& no_rerun) {
  if (by_rerun == differing) {
    return fmt::format("rerun in float64, every difference shrank with the precision, as rounding does and a lost or "
                       "changed contribution does not (the nearest to its bound, {}: {:.3g} in float32, {:.3g} in "
                       "float64): the same contributions summed in another order",
                       worst.name, worst.max_abs, t.float64);
  }
  return fmt::format("{}; each difference lies within the reordering error a sum of its own size allows ({:g} epsilons "
                     "of the tensor's own largest value; the nearest, {}: {:.3g}){}: taken as the same contributions "
                     "summed in another order",
                     no_rerun, kReassociationEps, worst.name, worst.max_abs,
                     by_rerun > 0 ? fmt::format(", {} of {} confirmed by a float64 rerun", by_rerun, differing) : "");
}

// A differing tensor that may be rounding at all: a gradient (or, compiled or with a float64
// rerun, the loss or an output), on both sides, finite.
bool may_be_rounding(const CheckContext& ctx, const TensorDiff& d) {
  const bool forward_value = d.kind == "loss" || d.kind == "output";
  if (!(is_gradient(d.kind) || (forward_value && (ctx.records.compiled || rerun_of(ctx))))) return false;
  return d.missing == "none" && d.note.empty() && d.nonfinite_checkpointed + d.nonfinite_reference == 0;
}

// Every recomputed call reproduced its forward bitwise (compiled, the graphs stand for the calls).
bool recomputes_faithful(const CheckContext& ctx) {
  size_t recomputed = 0;
  for (const auto& c : ctx.records.checkpointed.calls) {
    if (!c.recomputed) continue;
    ++recomputed;
    for (const auto& d : c.output_diffs) {
      if (!d.equal) return false;
    }
  }
  return recomputed > 0 || ctx.records.compiled;
}

}  // namespace

TensorRounding tensor_rounding(const CheckContext& ctx, const TensorDiff& d) {
  TensorRounding t;
  t.measured = d.max_abs;
  const auto* ref = ctx.records.reference.find(d.name, d.kind, d.step);
  if (!ref || !ref->value.defined() || !may_be_rounding(ctx, d)) {
    t.rule = "none";
    return t;
  }
  const double eps = d.kind == "loss" ? output_epsilon(ctx) : epsilon_of(ref->value);
  const auto* rerun = rerun_of(ctx);
  const auto* again = rerun ? rerun->find(d.name, d.kind, d.step) : nullptr;
  if (again && again->present && eps > kFloat64Epsilon) {
    // Rounding shrinks by the ratio of the precisions (about 2e-9 from float32); a lost or changed
    // contribution keeps its size. The bound lies halfway between, on a log scale.
    t.rule = "float64";
    t.float64 = again->max_abs;
    t.bound = d.max_abs * std::sqrt(kFloat64Epsilon / eps);
    t.rounding = again->max_abs <= t.bound;
    return t;
  }
  // Without that evidence: within the reordering error of a sum, measured on the tensor's own
  // largest value (never the step's: a gradient small beside the others is judged on its own size).
  t.rule = "own-scale";
  t.bound = kReassociationEps * eps * ref->value.detach().abs().max().item<double>();
  t.rounding = d.max_abs <= t.bound;
  return t;
}

RoundingEvidence rounding_evidence(const CheckContext& ctx, const std::vector<SiteExplanation>& explained) {
  RoundingEvidence e;
  e.details = nlohmann::json::object();
  // A unit that computes other values with autograd on than off (grad-mode: another kernel for the
  // same math) differs in its recompute by rounding, if the float64 rerun says so; every other
  // explanation is a real difference.
  const bool other_kernels = !explained.empty() && std::all_of(explained.begin(), explained.end(), [](const SiteExplanation& x) {
    return x.cause == Cause::kGradMode;
  });
  if (other_kernels && !rerun_of(ctx)) return e;
  if ((!explained.empty() && !other_kernels) || (!other_kernels && !recomputes_faithful(ctx))) return e;
  torch::NoGradGuard no_grad;
  size_t differing = 0, by_rerun = 0;
  const TensorDiff* worst = nullptr;  // the differing tensor that came nearest its bound
  TensorRounding worst_t;
  double worst_share = -1.0;
  for (const auto& d : ctx.diffs) {
    if (d.equal || is_state_kind(d.kind)) continue;
    ++differing;
    const auto t = tensor_rounding(ctx, d);
    if (!t.rounding) {
      e.against = d.name;
      e.details = {{"rule", t.rule}, {"tensor", d.name}, {"float32", d.max_abs}, {"bound", t.bound}};
      if (t.rule == "float64") e.details["float64"] = t.float64;
      e.sentence = against_sentence(d, t, no_rerun_reason(ctx));
      return e;
    }
    if (other_kernels && t.rule != "float64") return e;  // only float64 tells other kernels' rounding
    by_rerun += t.rule == "float64";
    const double share = t.rule == "float64" ? (d.max_abs > 0 ? t.float64 / d.max_abs : 0.0) : (t.bound > 0 ? d.max_abs / t.bound : 0.0);
    if (share > worst_share) {
      worst_share = share;
      worst = &d;
      worst_t = t;
    }
  }
  if (differing == 0 || worst == nullptr) return e;
  e.rounding = true;
  e.rule = by_rerun == differing ? "float64" : "own-scale";
  e.details = {{"rule", e.rule}, {"tensors", differing}, {"by_float64_rerun", by_rerun}, {"worst", worst->name},
               {"float32", worst->max_abs}, {"bound", worst_t.bound}};
  if (worst_t.rule == "float64") e.details["float64"] = worst_t.float64;
  e.sentence = for_sentence(*worst, worst_t, by_rerun, differing, no_rerun_reason(ctx));
  return e;
}

bool rounding_only(const CheckContext& ctx, const std::vector<SiteExplanation>& explained) {
  return rounding_evidence(ctx, explained).rounding;
}

}  // namespace ckcheck
