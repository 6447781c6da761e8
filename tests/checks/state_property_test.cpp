// Whole-model state, as a property: random models built from blocks with state of every kind
// (state/mix: plain, lazy-init, ema, counter, shifted by a buffer the parent updates), random
// policies. The test computes the truth itself -- which blocks are checkpointed and what each
// kind does when it is recomputed -- and ckcheck's verdict and causes must equal it.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>

#include "checks/check.h"
#include "tests/support/run_case.h"

namespace ckcheck {
namespace {

using testing::ModelCase;
using testing::run_case;

// What a block of each kind does under a checkpoint, independent of ckcheck: the causes a
// correct report may give for it (none: it is correct).
const std::map<std::string, std::set<Cause>>& truth() {
  static const std::map<std::string, std::set<Cause>> t = {
      {"plain", {}},
      {"lazy-init", {}},                                    // initialised in the forward; the recompute reuses it
      {"ema", {Cause::kBufferUpdate}},                      // a member tensor updated again by the recompute
      {"counter", {Cause::kStateful, Cause::kBufferUpdate}},  // its own count changes the recompute's output
      {"shifted", {Cause::kInPlace}},                       // the parent changes what it reads before the recompute
  };
  return t;
}

RC_GTEST_PROP(StateProperty, VerdictAndCausesEqualTheTruth, ()) {
  const std::vector<std::string> kinds = {"plain", "lazy-init", "ema", "counter", "shifted"};
  const auto layers = *rc::gen::inRange(1, 5);
  const auto blocks = *rc::gen::container<std::vector<std::string>>(static_cast<size_t>(layers), rc::gen::elementOf(kinds));
  const auto every = *rc::gen::inRange(1, 4);
  const bool none = *rc::gen::weightedOneOf<bool>({{1, rc::gen::just(true)}, {4, rc::gen::just(false)}});
  const ModelCase c{"state/mix",
                    {{"layers", std::to_string(layers)}, {"blocks", fmt::format("{}", fmt::join(blocks, ","))}, {"hidden", "16"}},
                    none ? "none" : fmt::format("every:{}", every),
                    *rc::gen::inRange<uint64_t>(0, 1000)};
  const auto r = run_case(c);
  const auto context = fmt::format("\nresults: {}\nreproduce: {}", r.summary(), c.command());

  // The truth: block i is checkpointed under every:K when i % K == 0.
  std::map<std::string, std::set<Cause>> allowed;  // faulty checkpointed site -> its causes
  for (int i = 0; i < layers; ++i) {
    const bool checkpointed = !none && i % every == 0;
    const auto& causes = truth().at(blocks[static_cast<size_t>(i)]);
    if (checkpointed && !causes.empty()) allowed[fmt::format("blocks.{}", i)] = causes;
  }
  bool failed = false;
  std::set<std::string> named;
  for (const auto& result : r.results) {
    failed = failed || result.status == Status::kFail || result.status == Status::kError;
    if (result.status != Status::kFail) continue;
    for (const auto& f : result.findings) {
      const auto it = allowed.find(f.site);
      if (it == allowed.end() || !it->second.count(f.cause)) {
        RC_FAIL(fmt::format("{} blames {} at '{}', which the truth does not allow", result.id, cause_name(f.cause), f.site) +
                context);
      }
      named.insert(f.site);
    }
  }
  RC_ASSERT(failed == !allowed.empty());
  for (const auto& [site, causes] : allowed) {
    if (!named.count(site)) RC_FAIL("no finding names " + site + context);
  }
}

}  // namespace
}  // namespace ckcheck
