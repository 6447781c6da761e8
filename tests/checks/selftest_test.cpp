// The selftest's judgement of one planted run, on hand-made results: caught needs the class's cause
// among the failing checks' findings, a plant that changed nothing is dormant (and a failure then a
// false alarm), a plant the steps call unequally cannot be judged; and which cells are planted.
#include "analyses/selftest.h"

#include <gtest/gtest.h>


namespace ckcheck {
namespace {

PlantOutcome live(bool manifest = true) {
  PlantOutcome o;
  o.plant = "rng-not-replayed";
  o.site = "blocks.0";
  o.cause = "rng";
  o.manifest = manifest;
  return o;
}

CheckResult failing(const std::string& id, Cause cause) {
  CheckResult r;
  r.id = id;
  r.status = Status::kFail;
  r.findings.push_back({cause, "blocks.0", "", "it differs", ""});
  return r;
}

TEST(Selftest, ACellIsCaughtOnlyWithTheClasssCause) {
  EXPECT_EQ(judge_plant(live(), {failing("rng", Cause::kRng)}).outcome, "caught");
  const auto other = judge_plant(live(), {failing("gradients", Cause::kUnexplained)});
  EXPECT_EQ(other.outcome, "other-cause");
  EXPECT_EQ(other.found, std::vector<std::string>{"unexplained"});
  EXPECT_NE(other.note.find("gradients"), std::string::npos) << other.note;
  CheckResult passed;
  passed.id = "gradients";
  EXPECT_EQ(judge_plant(live(), {passed}).outcome, "missed");
}

TEST(Selftest, APlantThatChangedNothingIsDormantAndAFailureThenAFalseAlarm) {
  CheckResult passed;
  passed.id = "gradients";
  EXPECT_EQ(judge_plant(live(false), {passed}).outcome, "dormant");
  EXPECT_EQ(judge_plant(live(false), {failing("hooks", Cause::kHookCount)}).outcome, "false-alarm");
}

TEST(Selftest, APlantTheStepsCallUnequallyCannotBeJudged) {
  auto o = live();
  o.invalid = "the plain step calls (root) 0 times";
  const auto cell = judge_plant(o, {failing("rng", Cause::kRng)});
  EXPECT_EQ(cell.outcome, "error");
  EXPECT_EQ(cell.note, o.invalid);
}

TEST(Selftest, ClassKIsPlantedAtUnitKOrAtEveryUnit) {
  Plan plan;
  plan.units = {{"blocks.0"}, {"blocks.1"}, {"blocks.2"}};
  const std::vector<PlantKind> kinds = {PlantKind::kRngNotReplayed, PlantKind::kInputInPlace, PlantKind::kStateTwice,
                                        PlantKind::kLostGradient};
  const auto sample = plant_cells(plan, kinds, false);
  ASSERT_EQ(sample.size(), 4u);
  EXPECT_EQ(sample[0].second, "blocks.0");
  EXPECT_EQ(sample[2].second, "blocks.2");
  EXPECT_EQ(sample[3].second, "blocks.0");
  EXPECT_EQ(plant_cells(plan, kinds, true).size(), 12u);
  EXPECT_TRUE(plant_cells(Plan{}, kinds, false).empty());
}

TEST(Selftest, ClassesNeedingAmpOrRanksAreNotApplicableWithout) {
  RunConfig config;
  EXPECT_FALSE(plant_not_applicable(PlantKind::kAutocastLost, config, 1).empty());
  EXPECT_FALSE(plant_not_applicable(PlantKind::kRankSameMask, config, 1).empty());
  config.amp = Amp::kBf16;
  EXPECT_TRUE(plant_not_applicable(PlantKind::kAutocastLost, config, 1).empty());
  EXPECT_TRUE(plant_not_applicable(PlantKind::kRankSameMask, config, 2).empty());
  EXPECT_TRUE(plant_not_applicable(PlantKind::kInputInPlace, config, 1).empty());
}

TEST(Selftest, EveryClassHasACauseOfTheVocabularyAndParsesByName) {
  for (const auto& c : plant_classes()) {
    EXPECT_TRUE(parse_cause(c.cause).has_value()) << c.name;
    EXPECT_EQ(parse_plant_kind(c.name), c.kind);
  }
  EXPECT_FALSE(parse_plant_kind("no-such-bug").has_value());
}

}  // namespace
}  // namespace ckcheck
