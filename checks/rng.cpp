// rng: a checkpointed site consumes random numbers and its recompute does not reproduce the
// forward's outputs: the RNG state was not replayed, or the site draws from a private generator or
// from one outside torch (Python's, NumPy's).
#include <fmt/ranges.h>

#include <algorithm>

#include "checks/common.h"
#include "checks/evidence.h"

namespace ckcheck {
namespace {

class RngCheck : public DeclaredCheck {
 public:
  // random ops and private generators are seen by the probe
  RngCheck()
      : DeclaredCheck(CheckInfo{"rng", CheckKind::kHazard, 40,
          "sites that draw random numbers (dropout) replay the forward's draws in the recompute"}
          .needing(&Needs::probe)) {}

  // Compiled: the random ops the compiled backward runs again, from the compiled graphs. New random
  // numbers fail the check when the checkpointed step differs from the plain one (the math moved).
  CheckResult run_compiled(const CheckContext& ctx) const {
    auto r = result();
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
    auto r = result();
    size_t random_sites = 0;
    bool host_only = true;  // every finding's draws are from generators outside torch
    for (const auto& unit : ctx.plan.units) {
      const auto d = draws_at(ctx, Plan::unit_label(unit));
      if (!d.consumed) continue;
      ++random_sites;
      if (!d.finding()) continue;
      host_only = host_only && !d.host.empty() && !d.private_gen;
      add_finding(r, finding_of(ctx, d));
    }
    summarize(ctx, r, random_sites, host_only);
    return r;
  }

 private:
  // What a checkpointed site drew, in its probe and in the step's calls, and whether the recompute
  // replayed it.
  struct SiteDraws {
    std::string site;
    const UnitProbe* probe = nullptr;
    std::string host;  // draws from generators outside torch (Python's, NumPy's), in words
    bool consumed = false, differs = false, replayed = true, private_gen = false, asked_off = false;
    bool drew_again = false, drew_other = false;
    const CallEvidence* unreplayed_call = nullptr;  // a call whose recompute drew what its forward did not
    const RandomDraw* unreplayed = nullptr;
    // Other numbers reached the step, and something says why.
    bool finding() const {
      return (differs || drew_again || drew_other) &&
             (private_gen || asked_off || !replayed || !host.empty() || unreplayed);
    }
  };

  static SiteDraws draws_at(const CheckContext& ctx, const std::string& site) {
    SiteDraws d;
    d.site = site;
    d.probe = probe_for(ctx, site);
    // Generators outside torch (Python's, NumPy's): their draws are no checkpoint's to replay.
    d.host = host_generator_draws(d.probe);
    d.consumed = d.probe && (d.probe->rng_consumed || !d.probe->random_ops.empty() || !d.host.empty());
    for (const auto& c : ctx.records.checkpointed.calls) {
      if (c.site != site) continue;
      d.consumed = d.consumed || c.rng_consumed || !c.forward_draws.empty();
      d.differs = d.differs || recompute_differs(c);
      d.replayed = d.replayed && c.rng_replayed;
      if (!d.unreplayed && (d.unreplayed = unreplayed_draw(c))) d.unreplayed_call = &c;
    }
    d.private_gen = (d.probe && d.probe->private_generator) || (d.unreplayed && d.unreplayed->private_generator);
    d.asked_off = !ctx.config.checkpoint.preserve_rng_state;
    // Selective checkpointing may hand back the forward's outputs: then the generator tells.
    d.drew_again = !d.differs && private_generator_drew_again(ctx, site);
    // Other numbers drawn where the unit's outputs still equal (a selective checkpoint hands back
    // the ops it saved) reach the backward when the step differs.
    d.drew_other = d.unreplayed && (d.differs || !checkpointed_step_unchanged(ctx));
    return d;
  }

  static std::string not_replayed_hint(bool asked_off) {
    return asked_off ? "keep RNG state: checkpoint with preserve_rng_state (drop --no-preserve-rng)"
                     : "the checkpoint under test does not replay the RNG state: call "
                       "torch.utils.checkpoint with preserve_rng_state=True (its default), or draw the "
                       "random numbers outside the checkpointed segment";
  }

  static Finding finding_of(const CheckContext& ctx, const SiteDraws& d) {
    Finding f;
    f.cause = Cause::kRng;
    f.site = d.site;
    if (d.probe) f.tensor = fmt::format("{}", fmt::join(d.probe->random_ops, ", "));
    f.details = {{"random_ops", d.probe ? d.probe->random_ops : std::vector<std::string>{}},
                 {"private_generator", d.private_gen},
                 {"rng_state_preserved", ctx.config.checkpoint.preserve_rng_state && d.replayed}};
    if (!d.host.empty() && !d.private_gen) {
      f.tensor = d.probe->host_generators.front();
      f.details["host_generators"] = d.probe->host_generators;
      f.message = d.host;
      f.hint = kHostGeneratorHint;
    } else if (d.private_gen) {
      private_generator_words(f, d.drew_again);
    } else if (d.unreplayed && !d.unreplayed->private_generator) {
      f.tensor = d.unreplayed->op;
      f.details["op"] = d.unreplayed->op;
      f.details["forward_draws"] = d.unreplayed_call->forward_draws.size();
      f.details["recompute_draws"] = d.unreplayed_call->recompute_draws.size();
      f.message = unreplayed_draw_words(*d.unreplayed_call, *d.unreplayed, !d.asked_off);
      const auto hint = unreplayed_draw_hint(*d.unreplayed_call, *d.unreplayed);
      f.hint = !hint.empty() ? hint : not_replayed_hint(d.asked_off);
    } else {
      f.message = "the site draws random numbers and the RNG state is not replayed in the "
                  "recompute (it ends in another RNG state than the forward), so it draws a different "
                  "mask than the forward";
      f.hint = not_replayed_hint(d.asked_off);
    }
    return f;
  }

  static void private_generator_words(Finding& f, bool drew_again) {
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
  }

  static void summarize(const CheckContext& ctx, CheckResult& r, size_t random_sites, bool host_only) {
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
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(RngCheck);

}  // namespace ckcheck
