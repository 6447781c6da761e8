// autocast: under AMP, the recompute must run each op in the dtype the forward ran it in. Then
// the precision question the field guide raises: how far from an fp32 step are the gradients of
// plain AMP, checkpointed AMP, and checkpointed AMP with the recompute kept in fp32? With AMP off,
// a recompute outside the precision context its forward ran under (float8 training, a quantized
// layer's switch): where a recompute did not reproduce its forward, the runner traced the dtypes.
#include <cmath>
#include <set>

#include "checks/common.h"
#include "checks/evidence.h"

namespace ckcheck {
namespace {

const CheckKnob kAmpErrorFactor{"amp-error-factor",
                                "warn when checkpointed AMP gradients are this many times further from fp32 than "
                                "plain AMP's (at least 1)",
                                2.0, 1.0, 1e6};

constexpr CauseWord kPrecisionContextWord{
    "precision-context",
    "enter the precision context (float8 or quantization switch, fp8_autocast) inside the checkpointed function, "
    "or use a checkpoint that restores it in the recompute, as it restores autocast"};

}  // namespace

const Cause kPrecisionContext{kPrecisionContextWord};

namespace {

// A call whose recompute made a cast or reduced-precision op another number of times than its
// forward: outside its forward's precision context.
Finding precision_context_finding(const CallEvidence& c, const PrecisionShift& shift) {
  Finding f{kPrecisionContext, c.site, shift.op, precision_shift_words(shift), kPrecisionContextWord.hint};
  f.details = {{"op", shift.op}, {"forward_count", shift.forward}, {"recompute_count", shift.recompute}};
  return f;
}

// ||g - g32|| / ||g32||, in double; NaN when either is missing.
double relative_error(const torch::Tensor& g, const torch::Tensor& g32) {
  if (!g.defined() || !g32.defined()) return std::nan("");
  auto a = g.detach().to(torch::kCPU, torch::kDouble);
  auto b = g32.detach().to(torch::kCPU, torch::kDouble);
  const double denom = b.norm().item<double>();
  const double num = (a - b).norm().item<double>();
  return denom > 0 ? num / denom : num;
}

// Op i of a checkpointed call ran in another dtype or under another autocast state.
Finding dtype_finding(const CallEvidence& c, size_t i, Cause cause) {
  auto at = [](const std::vector<std::string>& v, size_t k) { return k < v.size() ? v[k] : std::string("(none)"); };
  Finding f;
  f.cause = cause;
  f.site = c.site;
  f.tensor = at(c.forward_ops, i);
  f.details = {{"op_index", i},
               {"forward_op", at(c.forward_ops, i)},
               {"forward_dtype", at(c.forward_dtypes, i)},
               {"forward_autocast", at(c.forward_autocast, i)},
               {"recompute_op", at(c.recompute_ops, i)},
               {"recompute_dtype", at(c.recompute_dtypes, i)},
               {"recompute_autocast", at(c.recompute_autocast, i)},
               {"forward_ops", c.forward_ops.size()},
               {"recompute_ops", c.recompute_ops.size()}};
  auto ran = [&](const std::vector<std::string>& ops, const std::vector<std::string>& dtypes,
                 const std::vector<std::string>& autocast, bool failed) {
    const auto dtype = at(dtypes, i);
    return fmt::format("{} under autocast {} {}", at(ops, i), at(autocast, i),
                       dtype == "-" && failed ? "and threw" : "giving " + dtype);
  };
  f.message = fmt::format("op {} of the site ran as {} in the forward, but as {} in the recompute", i,
                          ran(c.forward_ops, c.forward_dtypes, c.forward_autocast, false),
                          ran(c.recompute_ops, c.recompute_dtypes, c.recompute_autocast,
                              c.recompute_failed && i + 1 == c.recompute_dtypes.size()));
  return f;
}

// The worst relative gradient error against the fp32 step, of each of the three AMP steps.
struct PrecisionStudy {
  double worst_plain = 0, worst_ckpt = 0, worst_fix = 0;
  bool worse = false;  // checkpointed AMP beyond the bound for some parameter
};

// A finding where checkpointed AMP is further from fp32 than plain AMP allows.
Finding precision_finding(const CheckContext& ctx, const std::string& param, double e_ckpt, double e_plain,
                          const nlohmann::json& row) {
  Finding f;
  f.cause = Cause::kAutocast;
  f.site = owning_unit(ctx.plan, param);
  f.tensor = param;
  f.details = row;
  f.message = fmt::format(
      "checkpointed AMP puts the gradient of {} {:.3g} (relative) from the fp32 step, "
      "{:.1f}x plain AMP's {:.3g} (bound: {:g}x)",
      param, e_ckpt, e_plain > 0 ? e_ckpt / e_plain : INFINITY, e_plain, ctx.knob(kAmpErrorFactor));
  f.hint = "keep the recompute in the forward's precision (restore autocast); compare "
           "with the fp32-recompute column before adopting it";
  return f;
}

PrecisionStudy study_precision(const CheckContext& ctx, CheckResult& r) {
  PrecisionStudy study;
  const auto& fp32 = ctx.records.fp32_reference;
  const auto& fix = ctx.records.fp32_recompute;
  if (!fp32 || !fix || !fp32->error.empty() || !ctx.records.reference.error.empty() ||
      !ctx.records.checkpointed.error.empty()) {
    return study;
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& t : fp32->tensors) {
    if (t.kind != "param-grad") continue;
    const auto* plain = ctx.records.reference.find(t.name, t.kind, t.step);
    const auto* ckpt = ctx.records.checkpointed.find(t.name, t.kind, t.step);
    const auto* rec = fix->error.empty() ? fix->find(t.name, t.kind, t.step) : nullptr;
    const double e_plain = plain ? relative_error(plain->value, t.value) : std::nan("");
    const double e_ckpt = ckpt ? relative_error(ckpt->value, t.value) : std::nan("");
    const double e_fix = rec ? relative_error(rec->value, t.value) : std::nan("");
    rows.push_back({{"param", t.name}, {"step", t.step}, {"plain_amp", e_plain},
                    {"checkpointed_amp", e_ckpt}, {"fp32_recompute", e_fix}});
    if (std::isfinite(e_plain)) study.worst_plain = std::max(study.worst_plain, e_plain);
    if (std::isfinite(e_ckpt)) study.worst_ckpt = std::max(study.worst_ckpt, e_ckpt);
    if (std::isfinite(e_fix)) study.worst_fix = std::max(study.worst_fix, e_fix);
    // 1e-6 relative error is below anything AMP can be blamed for.
    if (std::isfinite(e_ckpt) && e_ckpt > 1e-6 && e_ckpt > ctx.knob(kAmpErrorFactor) * e_plain) {
      study.worse = true;
      add_finding(r, precision_finding(ctx, t.name, e_ckpt, e_plain, rows.back()));
    }
  }
  if (!fix->error.empty()) r.details["fp32_recompute_error"] = fix->error;
  r.details["precision"] = rows;
  r.details["amp_error_factor"] = ctx.knob(kAmpErrorFactor);
  r.details["worst"] = {{"plain_amp", study.worst_plain}, {"checkpointed_amp", study.worst_ckpt},
                        {"fp32_recompute", study.worst_fix}};
  return study;
}

std::string study_text(const CheckContext& ctx, const PrecisionStudy& study) {
  const auto& fp32 = ctx.records.fp32_reference;
  const auto& fix = ctx.records.fp32_recompute;
  if (!ctx.records.checkpointed.error.empty()) return "gradient errors not measured: the checkpointed step failed";
  if (!fp32 || !fp32->error.empty()) return "the fp32 reference step did not run";
  return fmt::format(
      "gradient error against fp32 (worst parameter): plain AMP {:.3g}, checkpointed {:.3g}, "
      "fp32 recompute {}",
      study.worst_plain, study.worst_ckpt,
      fix && !fix->error.empty() ? "failed (" + fix->error + ")" : fmt::format("{:.3g}", study.worst_fix));
}

class AutocastCheck : public DeclaredCheck {
 public:
  AutocastCheck()
      : DeclaredCheck(CheckInfo{"autocast", CheckKind::kHazard, 50,
          "under --amp, the recompute runs every op in the forward's dtype, and checkpointing "
          "does not move gradients further from fp32 than plain AMP; a recompute that differs made its "
          "forward's float8 and quantization casts"}
          .needing(&Needs::dtype_trace)
          .needing(&Needs::amp_study)
          .with_knobs({kAmpErrorFactor})
          .with_causes({kPrecisionContext})) {}

  // Under FSDP2's mixed precision without autocast: the dtypes of the recompute's ops against the
  // forward's; no AMP study (there is no fp32 autocast-off twin of an engine's precision).
  CheckResult mixed_precision_result(const CheckContext& ctx, const std::string& mixed) const {
    auto r = result();
    std::set<std::string> reported;
    size_t traced = 0;
    for (const auto& c : ctx.records.checkpointed.calls) {
      if (!c.forward_dtypes.empty() && !c.recompute_dtypes.empty()) ++traced;
      const auto idx = first_dtype_difference(c);
      if (!idx || reported.count(c.site)) continue;
      reported.insert(c.site);
      add_finding(r, dtype_finding(c, *idx, Cause::kRecomputeDtype));
    }
    if (!r.findings.empty()) {
      r.status = Status::kFail;
      r.summary = fmt::format("{} recompute in other dtypes than their forward under FSDP2's mixed precision ({})",
                              count_of(reported.size(), "site"), mixed);
    } else if (traced == 0) {
      return skipped(id(), "no checkpointed call was recomputed with its ops traced");
    } else {
      r.summary = fmt::format("{} recompute their ops in the dtypes of their forward under FSDP2's mixed precision ({})",
                              count_of(traced, "checkpointed call"), mixed);
    }
    return r;
  }

  // AMP off: where a recompute did not reproduce its forward, the runner traced its ops' dtypes;
  // one that made a float8 or quantization cast another number of times ran outside its context.
  CheckResult precision_context_result(const CheckContext& ctx) const {
    auto r = result();
    // Where the evidence names the site's cause as its precision context, not another (grad mode,
    // changed state, random numbers), which the gradients check names.
    std::set<std::string> explained, reported;
    for (const auto& e : explain_sites(ctx)) {
      if (e.cause == kPrecisionContext) explained.insert(e.site);
    }
    for (const auto& c : ctx.records.checkpointed.calls) {
      const auto shift = precision_shift(c);
      if (!shift || !explained.count(c.site) || !reported.insert(c.site).second) continue;
      add_finding(r, precision_context_finding(c, *shift));
    }
    if (r.findings.empty()) return skipped(id(), "AMP is off (--amp bf16 on the CPU; fp16 or bf16 on CUDA)");
    r.status = Status::kFail;
    r.summary = fmt::format("{} recompute outside the precision context their forward ran under",
                            count_of(reported.size(), "site"));
    return r;
  }

  CheckResult run(const CheckContext& ctx) const override {
    auto r = result();
    if (auto compiled = skipped_when_compiled(id(), ctx)) return *compiled;
    // FSDP2's mixed precision casts the parameters, not autocast: the recompute must run each op
    // in the dtype its forward did (the dtype-loss class of FSDP2 with activation checkpointing).
    const auto mixed = engine_mixed_precision(ctx.config.data_parallel);
    if (ctx.config.amp == Amp::kOff && mixed != "off") return mixed_precision_result(ctx, mixed);
    if (ctx.config.amp == Amp::kOff) return precision_context_result(ctx);
    std::set<std::string> reported;
    for (const auto& c : ctx.records.checkpointed.calls) {
      const auto idx = first_dtype_difference(c);
      if (!idx || reported.count(c.site)) continue;
      reported.insert(c.site);
      add_finding(r, dtype_finding(c, *idx, Cause::kAutocast));
    }
    const bool mismatch = !r.findings.empty();
    const auto study = study_precision(ctx, r);
    const auto text = study_text(ctx, study);
    if (mismatch) {
      r.status = Status::kFail;
      r.summary = fmt::format("{} recompute under another autocast state or in other dtypes than their forward; {}",
                              count_of(reported.size(), "site"), text);
    } else if (study.worse) {
      r.status = Status::kWarn;
      r.summary = fmt::format("checkpointing moves gradients further from fp32 than plain AMP; {}", text);
    } else {
      r.summary = fmt::format("every recomputed op ran under its forward's autocast state and in its dtype ({}); {}",
                              amp_name(ctx.config.amp), text);
    }
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(AutocastCheck);

}  // namespace ckcheck
