// rank-rng (with --world-size): each rank draws its own dropout masks, and each rank's recompute
// replays its own draws.
#include <algorithm>
#include <map>
#include <set>

#include "checks/common.h"
#include "harness/support/text.h"

namespace ckcheck {
namespace {

// Draws later than each rank's first that two ranks make from the same generator state (a mask a
// site seeds alike on every rank, after dropout each rank draws its own): one finding per site.
void shared_draws(const std::vector<RunRecords::Rank>& ranks, CheckResult& r) {
  std::map<uint64_t, std::pair<int, const RunRecords::Rank::Draw*>> seen;  // state -> first rank drawing it
  std::set<std::string> named;
  for (const auto& k : ranks) {
    for (const auto& d : k.draws_at) {
      auto [it, fresh] = seen.emplace(d.state, std::make_pair(k.rank, &d));
      if (fresh || it->second.first == k.rank || !named.insert(d.site).second) continue;
      const bool first_already = std::any_of(r.findings.begin(), r.findings.end(),
                                             [&](const Finding& f) { return f.site == d.site; });
      if (first_already) continue;
      add_finding(r, {Cause::kRng, d.site, d.op,
                      fmt::format("ranks {} and {} draw {} at {} from the same generator state, so they draw the "
                                  "same numbers there (a mask or noise seeded alike on every rank)",
                                  it->second.first, k.rank, d.op, d.site),
                      "seed every generator the model draws from per rank (seed + rank), including a torch.Generator "
                      "of its own or one forked with torch.random.fork_rng"});
    }
  }
}

class RankRngCheck : public DeclaredCheck {
 public:
  RankRngCheck()
      : DeclaredCheck(CheckInfo{"rank-rng", CheckKind::kTraining, 130,
          "(with --world-size) ranks draw different random numbers, and each rank's recompute "
          "replays its own"}) {}

  CheckResult run(const CheckContext& ctx) const override {
    auto r = result();
    const auto& ranks = ctx.records.ranks;
    if (ranks.size() < 2) {
      return skipped(id(), "a single process (--world-size 1)");
    }
    bool draws = false;
    std::map<uint64_t, int> first_rank;
    for (const auto& k : ranks) {
      draws = draws || k.draws;
      if (!k.error.empty()) {
        // Its draws were not all seen: nothing to judge, and the error is not about random numbers.
        return errored(id(), fmt::format("rank {}'s checkpointed step failed, so its random draws cannot be judged: {}",
                                         k.rank, first_line(k.error)));
      }
      if (k.draws && !k.replayed) {
        add_finding(r, {Cause::kRng, k.first_draw, fmt::format("rank {}", k.rank),
                        fmt::format("rank {}'s recompute does not replay its own random draws", k.rank), ""});
      }
      auto [it, fresh] = first_rank.emplace(k.rng_start, k.rank);
      if (!fresh && k.draws) {
        add_finding(r, {Cause::kRng, k.first_draw, fmt::format("rank {}", k.rank),
                        fmt::format("ranks {} and {} draw their first random numbers from the same generator "
                                    "state, so they draw the same dropout masks",
                                    it->second, k.rank),
                        "seed each rank differently (seed + rank), and inside the model do not reseed a forked "
                        "generator (torch.random.fork_rng) or a torch.Generator of its own with the same seed on "
                        "every rank, as data-parallel training does"});
      }
    }
    shared_draws(ranks, r);
    if (!r.findings.empty()) {
      r.status = Status::kFail;
      r.summary = "random draws are not per rank, or not replayed";
    } else {
      r.summary = draws ? fmt::format("{} ranks draw their own random numbers, and each recompute replays them", ranks.size())
                        : "no checkpointed site draws random numbers";
    }
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(RankRngCheck);

}  // namespace ckcheck
