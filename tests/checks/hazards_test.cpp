// The hazard checks against planted faults: each fault makes its own check fail with its own
// cause at its site, and no other hazard check fail; clean configurations pass every check.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checks/check.h"
#include "fixtures/registry.h"
#include "tests/support/run_case.h"

namespace ckcheck {
namespace {

using testing::ModelCase;
using testing::CaseResult;
using testing::run_case;

bool is_hazard_check(const std::string& id) {
  const auto& ids = hazard_check_ids();
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// The sites a unit label stands for: itself, or for a segment "blocks.0..blocks.2" each block in it.
std::vector<std::string> sites_of_unit(const std::string& label) {
  const auto dots = label.find("..");
  if (dots == std::string::npos) return {label};
  const auto first = label.substr(0, dots), last = label.substr(dots + 2);
  const auto cut = first.rfind('.');
  if (cut == std::string::npos || last.rfind(first.substr(0, cut + 1), 0) != 0) return {first, last};
  const auto prefix = first.substr(0, cut + 1);
  std::vector<std::string> out;
  for (int k = std::stoi(first.substr(cut + 1)); k <= std::stoi(last.substr(cut + 1)); ++k) {
    out.push_back(prefix + std::to_string(k));
  }
  return out;
}

// True when no parameter under `site` (a unit label: a module or a segment of blocks) got a
// non-zero gradient in the plain (reference) step: a small convnet whose ReLUs are all dead is
// such a model, and equal gradients there prove nothing.
bool reference_gradients_zero_under(const RunRecords& records, const std::string& site) {
  size_t params = 0;
  for (const auto& module : sites_of_unit(site)) {
    for (const auto& t : records.reference.tensors) {
      if (t.kind != "param-grad" || t.name.rfind(module + ".", 0) != 0) continue;
      ++params;
      if (t.value.defined() && t.value.ne(0).any().item<bool>()) return false;
    }
  }
  return params > 0;
}

// A vacuity warning is right only where it is true: the policy checkpoints nothing, or the
// reference step itself left every gradient under the named site at zero.
bool rightly_vacuous(const CaseResult& r, const CheckResult& result) {
  if (result.status != Status::kWarn || result.findings.empty()) return false;
  for (const auto& f : result.findings) {
    if (f.cause != Cause::kVacuous) return false;
    const bool nothing_checkpointed = r.units == 0 && f.site.empty();
    if (!nothing_checkpointed && (f.site.empty() || !reference_gradients_zero_under(r.records, f.site))) {
      return false;
    }
  }
  return true;
}

RC_GTEST_PROP(Hazards, CleanConfigurationsPassEveryCheck, ()) {
  const auto c = *testing::clean_model_case(/*with_amp=*/true);
  const auto r = run_case(c);
  for (const auto& result : r.results) {
    if (result.status != Status::kPass && result.status != Status::kSkip && !rightly_vacuous(r, result)) {
      RC_FAIL(fmt::format("{} is {}: {}\nreproduce: {}", result.id, status_name(result.status),
                          r.summary(), c.command()));
    }
  }
}

// One planted hazard, where it is, and what must find it.
struct HazardCase {
  ModelCase model;
  std::vector<std::string> flags;
  std::string check;   // the check that must fail
  Cause cause = Cause::kUnexplained;
  std::string site;    // a site the check must name ("" for any)
  std::string command() const {
    return model.command(fmt::format("{}", fmt::join(flags, " ")));
  }
};

std::ostream& operator<<(std::ostream& os, const HazardCase& h) { return os << h.command(); }

rc::Gen<HazardCase> hazard_case() {
  return rc::gen::exec([] {
    HazardCase h;
    const int layers = *rc::gen::element(1, 2, 3, 4);
    const int fault = *rc::gen::inRange(0, layers);
    h.model.seed = *rc::gen::inRange<uint64_t>(0, 100000);
    h.model.options = {{"layers", std::to_string(layers)},
                       {"hidden", std::to_string(*rc::gen::inRange(2, 33))},
                       {"batch", std::to_string(*rc::gen::inRange(2, 5))}};
    h.model.policy = *rc::gen::element<std::string>("every:1", "sites:blocks." + std::to_string(fault));
    // element, not inRange: inRange favours small values at small sizes, and every kind must come.
    const int kind = *rc::gen::element(0, 1, 2, 3, 4, 5, 6, 7);
    auto faulty = [&](const std::string& name, const std::string& check, Cause cause) {
      h.model.model = name;
      h.model.options["fault-site"] = std::to_string(fault);
      h.check = check;
      h.cause = cause;
      h.site = "blocks." + std::to_string(fault);
    };
    switch (kind) {
      case 0: faulty("faulty/inplace-input", "input-mutation", Cause::kInPlace); break;
      case 1:
        faulty("faulty/private-generator", "rng", Cause::kRng);
        // The recompute draws a fresh p = 0.5 mask of batch x 2*hidden entries: in a layer of a
        // few units it is the forward's mask now and then (1 in 256 at 2 x 4), and a recompute
        // equal to its forward has nothing to show. 2 x 32 entries make that 2^-64.
        h.model.options["hidden"] = std::to_string(*rc::gen::inRange(16, 33));
        break;
      case 2: faulty("faulty/stateful-counter", "determinism", Cause::kStateful); break;
      case 3: faulty("faulty/nondeterministic-op", "determinism", Cause::kNonDeterministic); break;
      case 4:
        faulty("faulty/autocast-sensitive", "autocast", Cause::kAutocast);
        h.model.amp = true;
        break;
      case 5:  // dropout without RNG replay, at every checkpointed block
        h.model.model = *rc::gen::element<std::string>("transformer", "mlp");
        h.model.options.erase("hidden");
        h.model.options["dropout"] = *rc::gen::element<std::string>("0.2", "0.5");
        h.flags = {"--no-preserve-rng"};
        h.check = "rng";
        h.cause = Cause::kRng;
        h.site = "blocks." + std::to_string(fault);
        break;
      case 6:  // autocast state lost in the recompute
        h.model.model = *rc::gen::element<std::string>("transformer", "mlp");
        h.model.options.erase("hidden");
        h.model.amp = true;
        h.flags = {"--no-restore-autocast"};
        h.check = "autocast";
        h.cause = Cause::kAutocast;
        h.site = "blocks." + std::to_string(fault);
        break;
      default:  // BatchNorm updated twice
        h.model.model = "convnet";
        h.model.options.erase("hidden");
        h.model.options["channels"] = std::to_string(*rc::gen::inRange(1, 6));
        h.model.options["size"] = std::to_string(*rc::gen::inRange(2, 6));
        h.check = "buffers";
        h.cause = Cause::kBufferUpdate;
        h.site = "blocks." + std::to_string(fault);
        break;
    }
    // The flag hazards are everywhere: under every:1 any checkpointed block may be named (the
    // step may stop at the first recompute that fails), under sites:blocks.K it must be K.
    if ((kind == 5 || kind == 6) && h.model.policy == "every:1") h.site = "";
    return h;
  });
}

RC_GTEST_PROP(Hazards, EachPlantedHazardIsFoundWhereItIsAndNowhereElse, ()) {
  const auto h = *hazard_case();
  RC_TAG(h.check);
  const auto r = run_case(h.model, h.flags);
  const auto context = fmt::format("\nresults: {}\nreproduce: {}", r.summary(), h.command());
  const auto& target = r.check(h.check);
  if (target.status != Status::kFail) RC_FAIL(h.check + " did not fail" + context);
  bool named = false;
  for (const auto& f : target.findings) {
    if (f.cause != h.cause) RC_FAIL(fmt::format("{} names cause {}", h.check, cause_name(f.cause)) + context);
    named = named || f.site == h.site || (h.site.empty() && !f.site.empty());
  }
  if (!named) RC_FAIL(fmt::format("{} does not name site {}", h.check, h.site) + context);
  for (const auto& other : r.results) {
    if (other.id == h.check || other.status != Status::kFail) continue;
    if (is_hazard_check(other.id)) RC_FAIL("unrelated hazard check " + other.id + " failed" + context);
    // The symptom checks may fail alongside, with the same cause.
    for (const auto& f : other.findings) {
      if (f.cause != h.cause) {
        RC_FAIL(fmt::format("{} fails with cause {}", other.id, cause_name(f.cause)) + context);
      }
    }
  }
}

// The protections, one by one: with each one on, its check passes; off, it fails.
struct Control {
  std::string name;
  ModelCase model;
  std::vector<std::string> on, off;  // flags that switch the protection on or off
  std::string check;
};

std::ostream& operator<<(std::ostream& os, const Control& c) { return os << c.name; }

class ProtectionControl : public ::testing::TestWithParam<Control> {};

TEST_P(ProtectionControl, PassesWithTheProtectionAndFailsWithout) {
  const auto& c = GetParam();
  const auto on = run_case(c.model, c.on);
  EXPECT_EQ(on.check(c.check).status, Status::kPass) << on.summary();
  const auto off = run_case(c.model, c.off);
  EXPECT_EQ(off.check(c.check).status, Status::kFail) << off.summary();
}

ModelCase with_amp(ModelCase c) {
  c.amp = true;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Checks, ProtectionControl,
    ::testing::Values(
        Control{"rng", {"transformer", {{"dropout", "0.3"}}, "every:1", 1}, {}, {"--no-preserve-rng"}, "rng"},
        Control{"autocast", with_amp({"transformer", {}, "every:1", 2}), {}, {"--no-restore-autocast"}, "autocast"},
        Control{"buffers", {"convnet", {}, "every:1", 3}, {"--restore-buffers"}, {}, "buffers"}),
    [](const auto& info) { return info.param.name; });

TEST(Hazards, ConvnetPassesWithRestoredBuffersAndFailsWithout) {
  ModelCase c{"convnet", {}, "every:1", 0};
  auto twice = run_case(c);
  EXPECT_EQ(twice.check("buffers").status, Status::kFail);
  EXPECT_EQ(twice.check("gradients").status, Status::kPass);
  auto fixed = run_case(c, {"--restore-buffers"});
  EXPECT_EQ(fixed.check("buffers").status, Status::kPass) << fixed.summary();
}

TEST(Hazards, InPlaceInputIsReportedWhetherOrNotTheCheckpointRefuses) {
  ModelCase c{"faulty/inplace-input", {}, "every:1", 0};
  for (const auto& flags : {std::vector<std::string>{}, std::vector<std::string>{"--no-check-inputs"}}) {
    auto r = run_case(c, flags);
    const auto& m = r.check("input-mutation");
    ASSERT_EQ(m.status, Status::kFail) << r.summary();
    EXPECT_EQ(m.findings.at(0).site, "blocks.1");
    EXPECT_EQ(m.findings.at(0).tensor, "input 0");
    EXPECT_EQ(r.check("gradients").status, Status::kFail) << r.summary();
    EXPECT_EQ(r.check("gradients").findings.at(0).cause, Cause::kInPlace);
  }
  // The control: the mlp it is made from passes.
  EXPECT_EQ(run_case({"mlp", {}, "every:1", 0}).check("input-mutation").status, Status::kPass);
}

TEST(Hazards, NonDeterministicWithinToleranceIsAWarning) {
  ModelCase c{"faulty/nondeterministic-op", {}, "sites:blocks.1", 0};
  auto model = make_model(c.model, c.options, c.seed);
  Runner runner(*model, RunConfig());
  const auto plan = Plan::make(*model, {}, Policy::parse(c.policy));
  auto loose = run_checks(runner, plan, Tolerance::parse("rtol=1e-3,atol=1e-5"), select_checks({}));
  for (const auto& r : loose.results) {
    if (r.id == "determinism") {
      EXPECT_EQ(r.status, Status::kWarn) << r;
    }
  }
  auto strict = run_checks(runner, plan, Tolerance(), select_checks({}));
  for (const auto& r : strict.results) {
    if (r.id == "determinism") {
      EXPECT_EQ(r.status, Status::kFail) << r;
    }
  }
}

TEST(Hazards, SharedModuleCheckpointedTwiceFiresItsHooksTwice) {
  auto r = run_case({"faulty/double-hook", {}, "every:1", 0});
  const auto& h = r.check("hooks");
  ASSERT_EQ(h.status, Status::kFail) << r.summary();
  EXPECT_EQ(h.findings.at(0).cause, Cause::kHookCount);
  EXPECT_EQ(h.findings.at(0).tensor, "blocks.1.fc1.weight");
  EXPECT_EQ(h.findings.at(0).details.at("fires"), 2);
  EXPECT_EQ(r.check("gradients").status, Status::kPass) << "the gradients themselves are right";
  // The control: checkpointing the whole block once (--sites 'blocks.?') fires each hook once.
  auto model = make_model("faulty/double-hook", {}, 0);
  Runner runner(*model, RunConfig());
  const auto plan = Plan::make(*model, {"blocks.?"}, Policy::parse("every:1"));
  EXPECT_EQ(plan.checkpointed(), (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2"}));
  for (const auto& result : run_checks(runner, plan, Tolerance(), select_checks({"hooks"})).results) {
    EXPECT_EQ(result.status, Status::kPass) << result;
  }
}

TEST(Hazards, AGradientPenaltyThroughEveryCheckpointIsComparedAndPasses) {
  // autograd::grad(create_graph) through each checkpointed block, then a backward that passes
  // through every checkpoint a second time: ckcheck::checkpoint gives plain autograd's gradients
  // (Conformance.DoubleBackwardAGradientPenaltyMatchesPlain pins the values against plain) up to
  // the order in which the first- and second-order contributions reach each .grad.
  const ModelCase penalty{"grad-penalty", {{"dropout", "0.3"}}, "every:1", 0};
  auto r = run_case(penalty);
  for (const auto& c : r.results) EXPECT_NE(c.status, Status::kFail) << r.summary();
  const auto& g = r.check("gradients");
  EXPECT_NE(g.status, Status::kFail) << r.summary();
  for (const auto& f : g.findings) EXPECT_EQ(f.cause, Cause::kAccumulationOrder) << g;
  // The control: the same step without the RNG replay draws other dropout masks in the recompute,
  // and the comparison sees it through the penalty's double backward.
  auto lost = run_case(penalty, {"--no-preserve-rng"});
  const auto& lg = lost.check("gradients");
  ASSERT_EQ(lg.status, Status::kFail) << lost.summary();
  EXPECT_EQ(lg.findings.at(0).cause, Cause::kRng) << lg;
}

TEST(Hazards, ZeroGradientsMakeEqualityVacuous) {
  auto r = run_case({"mlp", {{"zero-head", "true"}}, "every:1", 0});
  const auto& g = r.check("gradients");
  EXPECT_EQ(g.status, Status::kWarn);
  ASSERT_EQ(g.findings.size(), 3u);
  EXPECT_EQ(g.findings[0].cause, Cause::kVacuous);
  EXPECT_EQ(g.findings[0].site, "blocks.0");
  EXPECT_EQ(run_case({"mlp", {}, "every:1", 0}).check("gradients").status, Status::kPass);
}

TEST(Hazards, NanIsReportedWithWhereItExists) {
  auto r = run_case({"faulty/nan-log", {}, "every:1", 0});
  const auto& n = r.check("nan");
  ASSERT_EQ(n.status, Status::kFail);
  EXPECT_EQ(n.findings.at(0).cause, Cause::kNonFinite);
  EXPECT_TRUE(n.findings.at(0).details.at("without_checkpointing").get<bool>());
  EXPECT_EQ(r.check("gradients").status, Status::kPass) << "NaN in the same places is equal";
  EXPECT_EQ(run_case({"mlp", {}, "every:1", 0}).check("nan").status, Status::kPass);
}

TEST(Hazards, AmpPrecisionStudyReportsThreeErrorsPerParameter) {
  auto r = run_case(with_amp({"transformer", {}, "every:1", 0}));
  const auto& a = r.check("autocast");
  EXPECT_EQ(a.status, Status::kPass) << a;
  const auto& rows = a.details.at("precision");
  ASSERT_FALSE(rows.empty());
  for (const auto& row : rows) {
    // A correct checkpoint recomputes exactly: its error is plain AMP's.
    EXPECT_EQ(row.at("plain_amp").get<double>(), row.at("checkpointed_amp").get<double>()) << row;
    EXPECT_TRUE(row.at("fp32_recompute").is_number()) << row;
  }
  EXPECT_EQ(run_case({"transformer", {}, "every:1", 0}).check("autocast").status, Status::kSkip);
}

}  // namespace
}  // namespace ckcheck
