// `ckcheck plan` end to end, in process: the plan it recommends fits its budget when measured, its
// prediction is within 10% of the measurement, and a plan whose checkpointed step fails a check is
// never recommended.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "cli/app.h"
#include "tests/support/support.h"

namespace ckcheck {
namespace {

nlohmann::json plan_json(std::vector<std::string> args, int& exit_code) {
  const std::string path = testing::scratch_path("plan.json");
  std::remove(path.c_str());
  args.insert(args.begin(), "plan");
  for (const char* a : {"--steps", "3", "--warmup", "1", "--time-budget", "0", "--report"}) args.push_back(a);
  args.push_back("json=" + path);
  exit_code = cli::run_cli(args);
  std::ifstream in(path);
  if (!in) return nullptr;
  return nlohmann::json::parse(in);
}

const nlohmann::json& recommended(const nlohmann::json& plan) {
  for (const auto& a : plan.at("attempts")) {
    if (a.at("policy") == plan.at("recommendation")) return a;
  }
  throw std::runtime_error("the recommendation is none of the attempts");
}

// The README's table: 8 transformer blocks whose plain step needs about 135 MiB in a 60 MiB budget.
TEST(PlanCommand, TransformerPlanFitsItsBudgetAsPredicted) {
  int code = -1;
  const auto j = plan_json({"--model", "transformer", "--layers", "8", "--hidden", "128", "--heads", "4", "--seq", "128",
                            "--batch", "8", "--vocab", "64", "--memory-budget", "60MiB"},
                           code);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(code, 0);
  EXPECT_EQ(j.at("command"), "plan");
  EXPECT_EQ(j.at("verdict"), "pass");
  const auto& p = j.at("plan");
  const int64_t budget = 60ll << 20;
  EXPECT_EQ(p.at("memory_budget_bytes"), budget);
  // The plain step does not fit: the budget binds.
  EXPECT_GT(p.at("profile").at("peak_bytes").get<int64_t>() + p.at("baseline_bytes").get<int64_t>(), budget);
  ASSERT_TRUE(p.at("recommendation").is_string());
  const auto& a = recommended(p);
  EXPECT_EQ(a.at("checks"), "pass");
  EXPECT_LE(a.at("measured_total_bytes").get<int64_t>(), budget);
  EXPECT_LE(a.at("predicted_total_bytes").get<int64_t>(), budget);
  EXPECT_LE(std::abs(a.at("peak_error").get<double>()), 0.10) << a.dump(2);
  // Not every block: the plan recomputes no more than the budget needs.
  EXPECT_LT(a.at("sites").size(), 8u);
  // Its policy string is one run accepts, and run passes it.
  const std::string policy = p.at("recommendation");
  EXPECT_EQ(cli::run_cli({"run", "--model", "transformer", "--layers", "8", "--hidden", "128", "--heads", "4", "--seq", "128",
                          "--batch", "8", "--vocab", "64", "--policy", policy, "--report", "json=" + testing::scratch_path("run.json")}),
            0);
  EXPECT_NE(p.at("run_command").get<std::string>().find("--policy " + policy), std::string::npos);
}

TEST(PlanCommand, APlainStepThatFitsNeedsNoCheckpoint) {
  int code = -1;
  const auto j = plan_json({"--model", "transformer", "--layers", "8", "--memory-budget", "60MiB"}, code);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(code, 0);
  EXPECT_EQ(j.at("plan").at("recommendation"), "none");
  EXPECT_TRUE(j.at("plan").at("run_command").is_null());
}

// The fault is planted where the clean plan's first choice goes: that plan fails its checks, the
// site is set aside and the next plan is verified and recommended. Control: the same fault where no
// plan goes changes nothing.
TEST(PlanCommand, APlanThatFailsItsChecksIsNeverRecommended) {
  const std::vector<std::string> model = {"--model", "faulty/inplace-input", "--layers", "4", "--hidden", "64", "--batch", "64",
                                          "--memory-budget", "850KiB"};
  auto with_fault = [&](const std::string& site) {
    auto args = model;
    args.push_back("--fault-site");
    args.push_back(site);
    return args;
  };
  int code = -1;
  const auto control = plan_json(with_fault("3"), code);
  ASSERT_FALSE(control.is_null());
  EXPECT_EQ(code, 0);
  const auto& first = control.at("plan").at("attempts").at(0);
  EXPECT_EQ(first.at("checks"), "pass");
  EXPECT_EQ(control.at("plan").at("recommendation"), first.at("policy"));
  ASSERT_FALSE(first.at("sites").empty());
  const std::string hit = first.at("sites").at(0);
  ASSERT_NE(hit, "blocks.3");

  const auto j = plan_json(with_fault(hit.substr(hit.find('.') + 1)), code);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(code, 0);
  const auto& attempts = j.at("plan").at("attempts");
  ASSERT_GE(attempts.size(), 2u);
  EXPECT_EQ(attempts.at(0).at("policy"), first.at("policy"));  // the solver's first choice is the same
  EXPECT_EQ(attempts.at(0).at("checks"), "fail");
  EXPECT_EQ(attempts.at(0).at("set_aside"), nlohmann::json::array({hit}));
  const auto& rec = recommended(j.at("plan"));
  EXPECT_EQ(rec.at("checks"), "pass");
  for (const auto& s : rec.at("sites")) EXPECT_NE(s, hit);
  // The failed plan was measured beside it, shown and not ranked.
  bool shown = false;
  for (const auto& b : j.at("plan").at("measured").at("policies")) shown = shown || (b.at("policy") == first.at("policy") && b.at("checks") == "fail");
  EXPECT_TRUE(shown);
}

TEST(PlanCommand, BadBudgetsAreRefusedOrAnswered) {
  int code = -1;
  EXPECT_EQ(cli::run_cli({"plan", "--model", "mlp"}), 2);                               // no budget
  EXPECT_EQ(cli::run_cli({"plan", "--model", "mlp", "--memory-budget", "lots"}), 2);   // not a size
  const auto j = plan_json({"--model", "mlp", "--memory-budget", "1KiB"}, code);     // below the parameters
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(code, 1);
  EXPECT_EQ(j.at("verdict"), "fail");
  EXPECT_TRUE(j.at("plan").at("recommendation").is_null());
  EXPECT_NE(j.at("plan").at("recommendation_reason").get<std::string>().find("parameters, gradients and inputs alone"), std::string::npos);
}

}  // namespace
}  // namespace ckcheck
