// `ckcheck run` end to end, in process: each fixture and flag gives exactly the expected failing
// check and cause in the JSON report.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "checks/check.h"
#include "cli/app.h"
#include "tests/support/support.h"

namespace ckcheck {
namespace {

struct Expectation {
  std::string name;
  std::vector<std::string> args;
  int exit = 1;
  std::string failing;        // the one hazard check that must fail ("" for none)
  std::string cause;          // its cause
  std::string site;           // a site it names
};

std::ostream& operator<<(std::ostream& os, const Expectation& e) { return os << e.name; }

nlohmann::json run_json(const std::vector<std::string>& args, int& exit_code) {
  const std::string path = testing::scratch_path("json");
  std::remove(path.c_str());
  auto full = args;
  full.insert(full.begin(), "run");
  full.push_back("--report");
  full.push_back("json=" + path);
  exit_code = cli::run_cli(full);
  std::ifstream in(path);
  if (!in) return nullptr;
  return nlohmann::json::parse(in);
}

class JsonContract : public ::testing::TestWithParam<Expectation> {};

TEST_P(JsonContract, ExpectedCheckFailsWithItsCause) {
  const auto& e = GetParam();
  int code = -1;
  const auto j = run_json(e.args, code);
  ASSERT_FALSE(j.is_null()) << "no report written";
  EXPECT_EQ(code, e.exit);
  EXPECT_EQ(j.at("tool"), "ckcheck");
  EXPECT_EQ(j.at("command"), "run");
  EXPECT_EQ(j.at("verdict"), e.exit == 0 ? "pass" : "fail");
  EXPECT_TRUE(j.at("reproduce").get<std::string>().rfind("ckcheck run --model ", 0) == 0);
  const auto& hazards = hazard_check_ids();
  for (const auto& c : j.at("checks")) {
    const std::string id = c.at("id");
    const std::string status = c.at("status");
    const bool hazard = std::find(hazards.begin(), hazards.end(), id) != hazards.end();
    if (id == e.failing) {
      EXPECT_EQ(status, "fail") << id;
      bool named = false;
      for (const auto& f : c.at("findings")) {
        EXPECT_EQ(f.at("cause"), e.cause) << f.dump();
        EXPECT_FALSE(f.at("hint").get<std::string>().empty());
        named = named || f.at("site") == e.site;
      }
      EXPECT_TRUE(named) << c.dump(2);
    } else if (hazard) {
      EXPECT_NE(status, "fail") << id << " should not fail: " << c.dump(2);
    } else if (status == "fail") {
      // gradients, buffers and nan report the symptom, with the same cause.
      for (const auto& f : c.at("findings")) EXPECT_EQ(f.at("cause"), e.cause) << id << ": " << f.dump();
    }
  }
  for (const auto& t : j.at("tensors")) {
    for (const char* key : {"name", "kind", "equal", "max_abs", "max_rel", "max_ulp", "mismatched",
                            "nonfinite_reference", "nonfinite_checkpointed", "missing"}) {
      EXPECT_TRUE(t.contains(key)) << key;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Run, JsonContract,
    ::testing::Values(
        Expectation{"transformer", {"--model", "transformer"}, 0, "", "", ""},
        Expectation{"no_preserve_rng", {"--model", "transformer", "--no-preserve-rng"}, 1, "rng", "rng", "blocks.0"},
        Expectation{"convnet", {"--model", "convnet"}, 1, "buffers", "buffer-update", "blocks.0"},
        Expectation{"convnet_restored", {"--model", "convnet", "--restore-buffers"}, 0, "", "", ""},
        Expectation{"no_restore_autocast", {"--model", "transformer", "--amp", "bf16", "--no-restore-autocast"}, 1, "autocast", "autocast", "blocks.1"},
        Expectation{"inplace_input", {"--model", "faulty/inplace-input"}, 1, "input-mutation", "in-place", "blocks.1"},
        Expectation{"private_generator", {"--model", "faulty/private-generator"}, 1, "rng", "rng", "blocks.1"},
        Expectation{"stateful_counter", {"--model", "faulty/stateful-counter"}, 1, "determinism", "stateful", "blocks.1"},
        Expectation{"nondeterministic_op", {"--model", "faulty/nondeterministic-op"}, 1, "determinism", "non-deterministic", "blocks.1"},
        Expectation{"autocast_sensitive", {"--model", "faulty/autocast-sensitive", "--amp", "bf16"}, 1, "autocast", "autocast", "blocks.1"},
        Expectation{"nan_log", {"--model", "faulty/nan-log"}, 1, "nan", "non-finite", ""}),
    [](const auto& info) { return info.param.name; });

TEST(JsonContract, ConfigHasEveryOptionWithDefaults) {
  int code = -1;
  const auto j = run_json({"--model", "mlp"}, code);
  ASSERT_EQ(code, 0);
  for (const char* key : {"policy", "seed", "steps", "device", "amp", "tolerance", "preserve_rng_state",
                          "restore_autocast", "restore_buffers", "checks"}) {
    EXPECT_TRUE(j.at("config").contains(key)) << key;
  }
  EXPECT_EQ(j.at("model").at("name"), "mlp");
  EXPECT_EQ(j.at("model").at("checkpointed"), nlohmann::json({"blocks.0", "blocks.1", "blocks.2"}));
  EXPECT_EQ(j.at("model").at("options").at("layers"), "3");
}

TEST(JsonContract, ReproduceCommandReproduces) {
  int code = -1;
  const auto first = run_json({"--model", "transformer", "--layers", "3", "--seed", "7", "--no-preserve-rng",
                               "--sites", "blocks.*", "--policy", "every:2"}, code);
  ASSERT_EQ(code, 1);
  // Split the reproduce line back into arguments (it quotes only what needs quoting).
  std::string cmd = first.at("reproduce");
  std::vector<std::string> args;
  std::string cur;
  bool quoted = false;
  for (char ch : cmd) {
    if (ch == '\'') { quoted = !quoted; continue; }
    if (ch == ' ' && !quoted) { if (!cur.empty()) args.push_back(cur); cur.clear(); continue; }
    cur += ch;
  }
  if (!cur.empty()) args.push_back(cur);
  ASSERT_GE(args.size(), 3u);
  args.erase(args.begin(), args.begin() + 2);  // "ckcheck run"
  int again_code = -1;
  const auto again = run_json(args, again_code);
  EXPECT_EQ(again_code, code);
  EXPECT_EQ(again.at("tensors"), first.at("tensors"));
  EXPECT_EQ(again.at("checks"), first.at("checks"));
}

}  // namespace
}  // namespace ckcheck
