// rng: a checkpointed site consumes random numbers and its recompute does not reproduce the
// forward's outputs: the RNG state was not replayed, or the site draws from a private generator or
// from one outside torch (Python's, NumPy's).
#include <fmt/ranges.h>

#include <algorithm>

#include "checks/common.h"
#include "checks/evidence.h"

namespace ckcheck {
namespace {

class RngCheck : public Check {
 public:
  const CheckInfo& info() const override {
    static const CheckInfo info = [] {
      CheckInfo i{"rng", CheckKind::kHazard, 40,
                  "sites that draw random numbers (dropout) replay the forward's draws in the recompute"};
      i.needs.probe = true;  // random ops and private generators are seen by the probe
      return i;
    }();
    return info;
  }

  // Compiled: the random ops the compiled backward runs again, from the compiled graphs. New random
  // numbers fail the check when the checkpointed step differs from the plain one (the math moved).
  CheckResult run_compiled(const CheckContext& ctx) const {
    CheckResult r;
    r.id = id();
    const auto& c = *ctx.records.compiled;
    const bool differs = !checkpointed_step_unchanged(ctx);
    for (const auto& op : c.recomputed_random) {
      Finding f;
      f.cause = Cause::kRng;
      f.site = op.site.empty() ? "(compiled graph)" : op.site;
      f.tensor = op.source.empty() ? op.op : op.source;
      f.message = fmt::format("the compiled backward runs {} again with new random numbers (the backward graph draws "
                              "its own seeds){}",
                              op.source.empty() ? op.op : fmt::format("{} ({})", op.source, op.op),
                              differs ? ", so the recompute's mask differs from the forward's"
                                      : "; the checkpointed step still equals the plain one");
      f.hint = kCompiledRngHint;
      f.details = {{"op", op.op}, {"source", op.source}, {"module", op.site}};
      add_finding(r, f);
    }
    if (!r.findings.empty()) {
      r.status = differs ? Status::kFail : Status::kWarn;
      r.summary = fmt::format("the compiled backward recomputes {} with new random numbers",
                              count_of(r.findings.size(), "random op"));
    } else if (c.replayed_random > 0) {
      r.summary = fmt::format("the compiled backward recomputes {} on the forward's seeds (replayed)",
                              count_of(static_cast<size_t>(c.replayed_random), "random op"));
    } else {
      r.summary = "the compiled backward recomputes no random op";
    }
    return r;
  }

  CheckResult run(const CheckContext& ctx) const override {
    if (ctx.records.compiled) return run_compiled(ctx);
    CheckResult r;
    r.id = id();
    size_t random_sites = 0;
    bool host_only = true;  // every finding's draws are from generators outside torch
    for (const auto& unit : ctx.plan.units) {
      const auto site = Plan::unit_label(unit);
      const UnitProbe* probe = probe_for(ctx, site);
      // Generators outside torch (Python's, NumPy's): their draws are no checkpoint's to replay.
      const std::string host = host_generator_draws(probe);
      bool consumed = probe && (probe->rng_consumed || !probe->random_ops.empty() || !host.empty());
      bool differs = false, replayed = true;
      const CallEvidence* unreplayed_call = nullptr;  // a call whose recompute drew what its forward did not
      const RandomDraw* unreplayed = nullptr;
      for (const auto& c : ctx.records.checkpointed.calls) {
        if (c.site != site) continue;
        consumed = consumed || c.rng_consumed || !c.forward_draws.empty();
        differs = differs || recompute_differs(c);
        replayed = replayed && c.rng_replayed;
        if (!unreplayed && (unreplayed = unreplayed_draw(c))) unreplayed_call = &c;
      }
      if (!consumed) continue;
      ++random_sites;
      const bool private_gen = (probe && probe->private_generator) || (unreplayed && unreplayed->private_generator);
      const bool asked_off = !ctx.config.checkpoint.preserve_rng_state;
      // Selective checkpointing may hand back the forward's outputs: then the generator tells.
      const bool drew_again = !differs && private_generator_drew_again(ctx, site);
      // Other numbers drawn where the unit's outputs still equal (a selective checkpoint hands back
      // the ops it saved) reach the backward when the step differs.
      const bool drew_other = unreplayed && (differs || !checkpointed_step_unchanged(ctx));
      if (!(differs || drew_again || drew_other) || !(private_gen || asked_off || !replayed || !host.empty() || unreplayed)) {
        continue;
      }
      Finding f;
      f.cause = Cause::kRng;
      f.site = site;
      std::string ops;
      if (probe) ops = fmt::format("{}", fmt::join(probe->random_ops, ", "));
      f.tensor = ops;
      f.details = {{"random_ops", probe ? probe->random_ops : std::vector<std::string>{}},
                   {"private_generator", private_gen},
                   {"rng_state_preserved", ctx.config.checkpoint.preserve_rng_state && replayed}};
      host_only = host_only && !host.empty() && !private_gen;
      if (!host.empty() && !private_gen) {
        f.tensor = probe->host_generators.front();
        f.details["host_generators"] = probe->host_generators;
        f.message = host;
        f.hint = kHostGeneratorHint;
      } else if (private_gen) {
        f.message = drew_again
                        ? "the site draws random numbers from its own generator, which no checkpoint saves or "
                          "restores: its recompute drew again (the generator ends the step elsewhere than the plain "
                          "step's), and the ops recomputed from those numbers feed the backward although the unit's "
                          "outputs equal the forward's (the checkpoint saved them)"
                        : "the site draws random numbers from its own torch::Generator, which no "
                          "checkpoint saves or restores, so its recompute draws other numbers";
        f.hint = drew_again ? "save the random op in the op policy (--sac-save ...,aten.OP), draw from the default "
                              "generator (whose state the checkpoint replays), or exclude this site from checkpointing"
                            : "draw from the default generator (whose state the checkpoint replays), or "
                              "exclude this site from checkpointing";
      } else if (unreplayed && !unreplayed->private_generator) {
        f.tensor = unreplayed->op;
        f.details["op"] = unreplayed->op;
        f.details["forward_draws"] = unreplayed_call->forward_draws.size();
        f.details["recompute_draws"] = unreplayed_call->recompute_draws.size();
        f.message = unreplayed_draw_words(*unreplayed_call, *unreplayed, !asked_off);
        const auto hint = unreplayed_draw_hint(*unreplayed_call, *unreplayed);
        f.hint = !hint.empty() ? hint
                 : asked_off  ? "keep RNG state: checkpoint with preserve_rng_state (drop --no-preserve-rng)"
                              : "the checkpoint under test does not replay the RNG state: call "
                                "torch.utils.checkpoint with preserve_rng_state=True (its default), or draw the "
                                "random numbers outside the checkpointed segment";
      } else {
        f.message = "the site draws random numbers and the RNG state is not replayed in the "
                    "recompute (it ends in another RNG state than the forward), so it draws a different "
                    "mask than the forward";
        f.hint = asked_off ? "keep RNG state: checkpoint with preserve_rng_state (drop --no-preserve-rng)"
                           : "the checkpoint under test does not replay the RNG state: call "
                             "torch.utils.checkpoint with preserve_rng_state=True (its default), or draw the "
                             "random numbers outside the checkpointed segment";
      }
      add_finding(r, f);
    }
    if (!r.findings.empty()) {
      r.status = Status::kFail;
      r.summary = fmt::format("{} recompute with other random numbers than the forward",
                              count_of(r.findings.size(), "site"));
      // Draws from generators outside torch in the recompute reach nothing when every compared
      // tensor still equals (as for determinism's findings).
      if (host_only && checkpointed_step_unchanged(ctx)) {
        r.status = Status::kWarn;
        r.summary += "; the checkpointed step still equals the plain one";
      }
    } else if (random_sites == 0) {
      r.summary = "no checkpointed site draws random numbers";
    } else {
      r.summary = fmt::format("{} random numbers; the recomputes replay them", 
                              random_sites == 1 ? std::string("1 checkpointed site draws")
                                                : fmt::format("{} checkpointed sites draw", random_sites));
    }
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(RngCheck);

}  // namespace ckcheck
