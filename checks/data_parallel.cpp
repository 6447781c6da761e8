// data-parallel (with --world-size): gradients averaged over the ranks against one process's
// step on the whole batch. The loss sums over examples, so the whole-batch gradient is the sum of
// the shards' and the average is it divided by the world size -- up to the order of the float
// additions, which differs: each rank sums its rows, then the all-reduce sums the ranks.
#include <algorithm>

#include "checks/common.h"
#include "checks/evidence.h"

namespace ckcheck {
namespace {

// Regrouping a float32 sum of n terms moves it by at most about n * 1.2e-7 of the sum of the
// magnitudes; 1e-4 relative covers regroupings of batches up to several hundred rows, and the
// absolute term covers gradients that cancel to near zero.
const char* kTolerance = "rtol=1e-4,atol=1e-6";
// Steps after the first: atol at least 64 float32 epsilons of the largest whole-batch value.
constexpr double kLaterSteps = 64 * 1.1920929e-07;

class DataParallelCheck : public DeclaredCheck {
 public:
  DataParallelCheck()
      : DeclaredCheck(CheckInfo{"data-parallel", CheckKind::kTraining, 120,
          "(with --world-size) gradients averaged over the ranks equal one process's on the "
          "whole batch, within the tolerance float reduction order allows"}
          .needing(&Needs::single_process)) {}

  CheckResult run(const CheckContext& ctx) const override {
    auto r = result();
    const auto* dp = ctx.config.data_parallel;
    if (!dp || !ctx.records.single_process) {
      return skipped(id(), "a single process (--world-size 1)");
    }
    if (draws_random_numbers(ctx)) {
      return skipped(id(), "the model draws random numbers: per-rank streams cannot reproduce one process's draws");
    }
    const auto bound = bound_of(ctx, *dp);
    const auto& alone = *ctx.records.single_process;
    if (!alone.error.empty()) {
      return errored(id(), "the single-process step failed: " + alone.error);
    }
    size_t compared = 0;
    for (const auto& t : ctx.records.reference.tensors) {
      if (t.kind != "param-grad") continue;
      const auto* whole = alone.find(t.name, t.kind, t.step);
      if (!whole || !whole->value.defined() || !t.value.defined()) continue;
      ++compared;
      if (auto f = averaged_gradient_differs(ctx, *dp, bound, t, whole->value)) add_finding(r, *f);
    }
    r.details = {{"tolerance", bound.text},
                 {"tolerance_reason", "float32 sums regrouped per rank then all-reduced differ from one sum by about n*eps of the "
                                      "magnitudes; after step 1, atol is at least 64 eps x the largest whole-batch value, as "
                                      "the updated parameters carry the first step's rounding"},
                 {"world_size", dp->world_size()}};
    if (!r.findings.empty()) {
      r.status = Status::kFail;
      r.summary = fmt::format("{} differ from the single-process step", count_of(r.findings.size(), "parameter gradient"));
    } else {
      r.summary = fmt::format("{} averaged over {} ranks equal the single-process step within {}",
                              count_of(compared, "parameter gradient"), dp->world_size(), bound.text);
    }
    return r;
  }

 private:
  // Random numbers anywhere in the step (not only in checkpointed sites: under --policy none
  // there are none).
  static bool draws_random_numbers(const CheckContext& ctx) {
    bool draws = ctx.records.reference.forward_draws || ctx.records.checkpointed.forward_draws;
    for (const auto& c : ctx.records.checkpointed.calls) draws = draws || c.rng_consumed || !c.forward_draws.empty();
    if (ctx.records.probes) {
      for (const auto& p : *ctx.records.probes) draws = draws || p.rng_consumed || !p.random_ops.empty();
    }
    return draws;
  }

  struct Bound {
    double amp_eps = 0.0;  // the precision's epsilon under autocast or mixed precision (0: float32)
    std::string text;
  };

  // Under autocast the products are rounded to bf16 or fp16, where the ranks' and the whole
  // batch's rows are summed in other groupings: differences of a few units in the last place of
  // the gradient's largest values, so the bound is relative to those. FSDP2's mixed precision
  // computes the whole step in bf16 or fp16 alike, against a float32 process.
  static Bound bound_of(const CheckContext& ctx, const DataParallel& dp) {
    const std::string mixed = dp.engine() ? dp.engine()->engine_mixed_precision() : "off";
    const std::string precision = mixed != "off" ? mixed : ctx.config.amp == Amp::kOff ? "off" : amp_name(ctx.config.amp);
    Bound b;
    b.amp_eps = precision == "bf16" ? 0.0078125 : precision == "fp16" ? 0.0009765625 : 0.0;
    b.text = b.amp_eps > 0 ? fmt::format("rtol={:g},atol={:g} x the largest whole-batch value ({} {})", 4 * b.amp_eps,
                                         4 * b.amp_eps, mixed != "off" ? "mixed precision" : "autocast", precision)
                           : kTolerance;
    return b;
  }

  static std::optional<Finding> averaged_gradient_differs(const CheckContext& ctx, const DataParallel& dp, const Bound& bound,
                                                          const TensorRecord& t, const torch::Tensor& whole) {
    const auto expected = whole / dp.world_size();
    auto tol = Tolerance::parse(kTolerance);
    if (bound.amp_eps > 0) {
      tol.rtol = 4 * bound.amp_eps;
      tol.atol = 4 * bound.amp_eps * expected.abs().max().item<double>();
    } else if (t.step > 1) {
      // After the first update the parameters carry that step's rounding too: the bound grows
      // with the gradient's largest value.
      tol.atol = std::max(tol.atol, kLaterSteps * expected.abs().max().item<double>());
    }
    auto d = compare_tensors(expected, t.value, tol);
    if (d.equal) return std::nullopt;
    Finding f;
    f.cause = Cause::kNonDeterministic;
    f.site = owning_unit(ctx.plan, t.name);
    f.tensor = t.name;
    f.details = diff_json(d);
    f.message = fmt::format("the gradient of {} averaged over {} ranks differs from the whole-batch "
                            "gradient by up to {:.3g} (relative {:.3g}), beyond {}",
                            t.name, dp.world_size(), d.max_abs, d.max_rel, bound.text);
    f.hint = "check that every rank gets its own shard of one global batch and that gradients are averaged";
    return f;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(DataParallelCheck);

}  // namespace ckcheck
