// Golden outputs of every report format. Numbers that vary between machines are {{num}} in the
// golden files ({{bytes}} for a size, whose unit varies too; scripts/make_golden.py makes them from
// a report); runs of spaces compare as one.
#include <gtest/gtest.h>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "ckcheck_test_ops_path.h"
#include "cli/app.h"
#include "tests/support/support.h"

namespace ckcheck {
namespace {

// Spaces pad table columns to the width of their numbers: compare runs of them as one.
std::string squeeze(const std::string& line) {
  std::string squeezed;
  for (char c : line) {
    if (c == ' ' && !squeezed.empty() && squeezed.back() == ' ') continue;
    squeezed += c;
  }
  return squeezed;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(squeeze(line));
  return out;
}

std::regex line_regex(const std::string& golden) {
  static const std::string specials = R"(\^$.|?*+()[]{})";
  std::string re;
  for (size_t i = 0; i < golden.size();) {
    if (golden.compare(i, 7, "{{num}}") == 0) {
      re += R"((-?[0-9][0-9.e+\-]*|-?nan|-?inf|null))";
      i += 7;
    } else if (golden.compare(i, 9, "{{bytes}}") == 0) {
      re += R"((-?[0-9][0-9.e+\-]*) (B|KiB|MiB|GiB|TiB))";  // a size, in whichever unit suits it
      i += 9;
    } else if (golden.compare(i, 8, "{{unit}}") == 0) {
      re += "(ns|us|ms|s)";  // a duration's unit follows its size
      i += 8;
    } else if (golden.compare(i, 7, "{{any}}") == 0) {
      re += ".*";
      i += 7;
    } else {
      if (specials.find(golden[i]) != std::string::npos) re += '\\';
      re += golden[i++];
    }
  }
  return std::regex(re);
}

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    // Each CTest process writes its own files.
    const auto dir = testing::test_binary_dir() + "/golden." + std::to_string(::getpid());
    std::filesystem::create_directories(dir);
    dir_ = dir;
    ::setenv("NO_COLOR", "1", 1);
    const std::vector<std::string> args = {
        "run", "--model", "mlp", "--layers", "2", "--hidden", "4", "--dropout", "0.5",
        "--no-preserve-rng", "--report", "console=" + dir + "/golden_run.txt",
        "--report", "json=" + dir + "/golden_run.json", "--report", "junit=" + dir + "/golden_run.xml",
        "--report", "markdown=" + dir + "/golden_run.md", "--report", "html=" + dir + "/golden_run.html"};
    exit_code_ = cli::run_cli(args);
    // The bench contract: a tiny model, no extra rounds, no too-fine warning to come and go.
    bench_exit_code_ = cli::run_cli({"bench", "--model", "mlp", "--layers", "2", "--hidden", "4", "--policies",
                                     "none,every:1", "--steps", "3", "--warmup", "1", "--time-budget", "0",
                                     "--max-overhead", "100", "--report", "json=" + dir + "/golden_bench.json"});
    // The diagnosis contract: dropout without RNG replay, found at both blocks, down to the op.
    diagnose_exit_code_ = cli::run_cli({"diagnose", "--model", "mlp", "--layers", "2", "--hidden", "4", "--dropout",
                                        "0.5", "--no-preserve-rng", "--report", "console=" + dir + "/golden_diagnose.txt",
                                        "--report", "json=" + dir + "/golden_diagnose.json", "--report",
                                        "markdown=" + dir + "/golden_diagnose.md"});
    // The plan contract: one of three blocks must be checkpointed to fit (deterministic on the CPU).
    plan_exit_code_ = cli::run_cli({"plan", "--model", "mlp", "--layers", "3", "--hidden", "32", "--batch", "16", "--memory-budget",
                                    "146KiB", "--steps", "2", "--warmup", "1", "--time-budget", "0", "--report",
                                    "console=" + dir + "/golden_plan.txt", "--report", "json=" + dir + "/golden_plan.json",
                                    "--report", "markdown=" + dir + "/golden_plan.md", "--report", "html=" + dir + "/golden_plan.html"});
    // The selftest contract: every class a single CPU process supports, planted into the mlp.
    selftest_exit_code_ = cli::run_cli({"selftest", "--model", "mlp", "--layers", "2", "--hidden", "4", "--dropout", "0.5",
                                        "--report", "console=" + dir + "/golden_selftest.txt", "--report",
                                        "json=" + dir + "/golden_selftest.json"});
    // The op-validation contract: an op that changes its argument in place without declaring it.
    validate_exit_code_ = cli::run_cli({"validate-op", "--library", CKCHECK_TEST_OPS_LIBRARY, "--op",
                                        "ckcheck_test::mutating", "--cases", "3", "--report",
                                        "console=" + dir + "/golden_validate-op.txt", "--report",
                                        "json=" + dir + "/golden_validate-op.json", "--report",
                                        "markdown=" + dir + "/golden_validate-op.md"});
  }
  // The reports are kept where a comparison failed (scripts/make_golden.py makes golden files of
  // them when the change is intended), removed otherwise.
  static void TearDownTestSuite() {
    const auto* suite = ::testing::UnitTest::GetInstance()->current_test_suite();
    if (suite != nullptr && suite->Failed()) return;
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  // The exit code each command must give: run, diagnose and validate-op find something (1),
  // bench measures (0).
  static int exit_code_of(const std::string& file) {
    if (file.rfind("bench", 0) == 0) return bench_exit_code_;
    if (file.rfind("diagnose", 0) == 0) return diagnose_exit_code_;
    if (file.rfind("validate-op", 0) == 0) return validate_exit_code_;
    if (file.rfind("plan", 0) == 0) return plan_exit_code_;
    if (file.rfind("selftest", 0) == 0) return selftest_exit_code_;
    return exit_code_;
  }
  static int exit_code_, bench_exit_code_, diagnose_exit_code_, validate_exit_code_, plan_exit_code_, selftest_exit_code_;
  static std::string dir_;
};
int Golden::exit_code_ = -1;
int Golden::bench_exit_code_ = -1;
int Golden::diagnose_exit_code_ = -1;
int Golden::validate_exit_code_ = -1;
int Golden::plan_exit_code_ = -1;
int Golden::selftest_exit_code_ = -1;
std::string Golden::dir_;

TEST_P(Golden, ReportMatchesItsGoldenFile) {
  const bool measures = GetParam().rfind("bench", 0) == 0 || GetParam().rfind("plan", 0) == 0;
  // bench, plan and a sound selftest exit 0; run, diagnose and validate-op find something (1).
  ASSERT_EQ(exit_code_of(GetParam()), measures || GetParam().rfind("selftest", 0) == 0 ? 0 : 1);
  auto actual = lines_of(dir_ + "/golden_" + GetParam());
  if (GetParam() == "bench.json" || GetParam() == "plan.json") {
    // Which warnings a bench gives depends on the machine's load (a policy measured faster than
    // none beyond the noise): the golden fixes the contract, so they are compared as none.
    std::ifstream in(dir_ + "/golden_" + GetParam());
    auto j = nlohmann::json::parse(in);
    auto& warnings = GetParam() == "plan.json" ? j.at("plan").at("measured").at("warnings") : j.at("warnings");
    ASSERT_TRUE(warnings.is_array());
    warnings = nlohmann::json::array();
    std::istringstream dumped(j.dump(2));
    actual.clear();
    for (std::string line; std::getline(dumped, line);) actual.push_back(squeeze(line));
  } else if (measures) {
    // The same for the text formats (their warning lines, and the blank line after a list of them);
    // the chart's geometry follows the times measured (tests/eager/test_chart.py checks it).
    std::vector<std::string> kept;
    bool in_svg = false;
    for (const auto& line : actual) {
      if (line.rfind("<svg", 0) == 0) in_svg = true;
      if (in_svg) {
        if (line.rfind("</svg>", 0) == 0) {
          in_svg = false;
          kept.push_back("<svg>(the chart)</svg>");
        }
        continue;
      }
      if (line.empty() || line.find("warning: ") != std::string::npos || line.find("class=\"warn\"") != std::string::npos) continue;
      kept.push_back(line);
    }
    actual = kept;
  }
  // What was compared, for scripts/make_golden.py when the change is intended.
  const auto compared_path = dir_ + "/compared_" + GetParam();
  {
    std::ofstream compared(compared_path);
    for (const auto& line : actual) compared << line << "\n";
  }
  const auto regenerate = "; regenerate with scripts/make_golden.py from " + compared_path + " if the change is intended";
  const auto golden = lines_of(testing::test_source_dir() + "/reports/golden/" + GetParam() + ".golden");
  ASSERT_FALSE(golden.empty());
  ASSERT_EQ(actual.size(), golden.size()) << "line counts differ" << regenerate;
  for (size_t i = 0; i < golden.size(); ++i) {
    EXPECT_TRUE(std::regex_match(actual[i], line_regex(golden[i])))
        << GetParam() << " line " << i + 1 << "\n  actual: " << actual[i] << "\n  golden: " << golden[i] << regenerate;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Golden,
                         ::testing::Values("run.txt", "run.json", "run.xml", "run.md", "run.html", "bench.json",
                                           "diagnose.txt", "diagnose.json", "diagnose.md", "validate-op.txt",
                                           "validate-op.json", "validate-op.md", "plan.txt", "plan.json", "plan.md", "plan.html",
                                           "selftest.txt", "selftest.json"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '.', '_');
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace ckcheck
