// The option tables: what a command line sets, the reproduce line gives back (a property over
// generated command lines), the report's config records the rows' values, and a field a library
// error names is given as the flag that sets it.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "cli/app.h"
#include "cli/bench.h"
#include "cli/run.h"
#include "cli/validate_op.h"
#include "harness/support/errors.h"
#include "harness/support/text.h"

namespace ckcheck {
namespace {

// Splits a reproduce line into arguments (its values are plain words here: no quoting needed).
std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::string word;
  for (char c : line) {
    if (c == ' ') {
      if (!word.empty()) out.push_back(word);
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) out.push_back(word);
  return out;
}

// Parses `args` (after the subcommand's name) with the run command's tables.
cli::RunOptions parse_run(const std::vector<std::string>& args) {
  cli::RunOptions o;
  CLI::App app;
  cli::add_model_args(app, o.model);
  cli::add_run_flags(app, o, select_checks({}));
  // The rows diagnose does not share, as run registers them.
  for (const auto& row : cli::run_option_table()) {
    if (!row.is_shared()) row.add(app, o);
  }
  app.parse(std::vector<std::string>(args.rbegin(), args.rend()));
  return o;
}

RC_GTEST_PROP(OptionTable, TheReproduceLineSetsWhatTheCommandLineSet, ()) {
  std::vector<std::string> args = {"--model", "mlp"};
  const auto seed = *rc::gen::inRange<uint64_t>(0, 1000);
  args.insert(args.end(), {"--seed", std::to_string(seed)});
  if (*rc::gen::arbitrary<bool>()) args.push_back("--no-preserve-rng");
  if (*rc::gen::arbitrary<bool>()) args.push_back("--restore-buffers");
  if (*rc::gen::arbitrary<bool>()) args.insert(args.end(), {"--accumulate", std::to_string(*rc::gen::inRange(1, 9))});
  if (*rc::gen::arbitrary<bool>()) args.insert(args.end(), {"--steps", std::to_string(*rc::gen::inRange(1, 5))});
  if (*rc::gen::arbitrary<bool>()) args.insert(args.end(), {"--lr", "0.25"});
  if (*rc::gen::arbitrary<bool>()) args.insert(args.end(), {"--checks", "gradients,rng"});
  const auto o = parse_run(args);
  const auto line = cli::run_command_line(o);
  auto again_args = words(line);
  RC_ASSERT(again_args.size() >= 2u);
  again_args.erase(again_args.begin(), again_args.begin() + 2);  // "ckcheck run"
  const auto again = parse_run(again_args);
  RC_ASSERT(cli::run_command_line(again) == line);
  RC_ASSERT(again.model.seed == seed);
  RC_ASSERT(again.config.accumulate == o.config.accumulate);
  RC_ASSERT(again.no_preserve_rng == o.no_preserve_rng);
  RC_ASSERT(again.checks == o.checks);
}

// What bash makes of a quoted argument, as "COUNT:FIRST": the number of words it became and
// the first (the reproduce line is pasted into a shell; control characters are written as bash's,
// zsh's and POSIX 2024 sh's $'...', which Debian 12's dash does not read).
std::string through_shell(const std::string& quoted) {
  char path[] = "/tmp/ckcheck-quote-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return "(mkstemp failed)";
  const std::string script = "set -- " + quoted + "; printf %s \"$#:$1\"";
  const bool written = write(fd, script.data(), script.size()) == static_cast<ssize_t>(script.size());
  close(fd);
  FILE* pipe = written ? popen(("bash " + std::string(path)).c_str(), "r") : nullptr;
  if (pipe == nullptr) {
    unlink(path);
    return "(popen failed)";
  }
  if (pipe == nullptr) return "(popen failed)";
  std::string out;
  char buffer[256];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  pclose(pipe);
  unlink(path);
  return out;
}

RC_GTEST_PROP(ShellQuote, AShellGivesBackEveryArgumentAsOneWord, ()) {
  // Any text a shell can carry (no NUL), with the characters that need quoting made likely.
  const auto arg = *rc::gen::container<std::string>(
      rc::gen::oneOf(rc::gen::elementOf(std::string("'\"\\ *?$`;&|<>(){}[]!#~\t\n-_./:=,+@%aZ9")),
                     rc::gen::inRange<char>(1, 127)));
  RC_ASSERT(through_shell(shell_quote(arg)) == "1:" + arg);
}

TEST(ShellQuote, PlainWordsStayBare) {
  EXPECT_EQ(shell_quote("blocks.0"), "blocks.0");
  EXPECT_EQ(shell_quote("rtol=1e-4,atol=1e-6"), "rtol=1e-4,atol=1e-6");
  EXPECT_EQ(shell_quote(""), "''");
}

TEST(OptionTable, DefaultsGiveOnlyTheRowsAlwaysShown) {
  cli::RunOptions o;
  o.model.model = "mlp";
  EXPECT_EQ(cli::run_command_line(o), "ckcheck run --model mlp --policy every:1 --seed 0");
  o.config.accumulate = 3;
  o.restore_buffers = true;
  EXPECT_EQ(cli::run_command_line(o), "ckcheck run --model mlp --policy every:1 --seed 0 --restore-buffers --accumulate 3");
}

TEST(OptionTable, TheConfigRecordsTheRowsWithAConfigKey) {
  cli::BenchCliOptions o;
  o.steps = 7;
  o.policies = {"none", "every:2"};
  const auto j = cli::config_options(o, cli::bench_option_table());
  EXPECT_EQ(j.at("steps"), 7);
  EXPECT_EQ(j.at("policies"), nlohmann::json({"none", "every:2"}));
  EXPECT_EQ(j.at("max_overhead"), max_overhead_knob().default_value);
  EXPECT_FALSE(j.contains("threads"));  // the config records the threads used, not the option
  cli::ValidateOpOptions v;
  v.op = "myops::gelu";
  EXPECT_EQ(cli::config_options(v, cli::validate_op_option_table()).at("op"), "myops::gelu");
}

TEST(FieldErrors, TheLibraryNamesFieldsAndTheCliGivesTheirFlags) {
  const FieldError e("input_file", "@input_file x.pt: holds no tensor; give @input_shape or @hidden (a@b.pt kept)");
  EXPECT_STREQ(e.what(), "input_file x.pt: holds no tensor; give input_shape or hidden (a@b.pt kept)");
  EXPECT_EQ(e.render(cli::flag_for_field), "--input x.pt: holds no tensor; give --input-shape or --hidden (a@b.pt kept)");
  EXPECT_EQ(cli::flag_for_field("sites"), "--sites");
  EXPECT_EQ(cli::flag_for_field("world_size"), "--world-size");
  EXPECT_EQ(cli::flag_for_field("accumulate"), "--accumulate");
  EXPECT_EQ(cli::flag_for_field("max_overhead"), "--max-overhead");
  EXPECT_EQ(cli::flag_for_field("shapes"), "--shapes");
}

// A library error reaches the user as one line that names the flag (no field name, no '@').
TEST(FieldErrors, ACommandLineErrorNamesTheFlag) {
  ::testing::internal::CaptureStderr();
  const int status = cli::run_cli({"run", "--model", "mlp", "--sites", "nothing.here"});
  const auto err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 2);
  EXPECT_NE(err.find("--sites 'nothing.here' matches no site of model mlp"), std::string::npos) << err;
  EXPECT_EQ(err.find('@'), std::string::npos) << err;
}

// A keyword front end (the Python binding) reaches every row by the flag's words and sets its
// field as its own type; the row's check still applies to the value's text.
TEST(OptionTable, EveryRowIsReachedByItsKeyword) {
  for (const auto& row : cli::run_option_table()) {
    EXPECT_EQ(cli::row_of_keyword(cli::run_option_table(), row.keyword()), &row) << row.flag();
    EXPECT_EQ(row.keyword().find('-'), std::string::npos) << row.flag();
  }
  EXPECT_EQ(cli::row_of_keyword(cli::run_option_table(), "no_such_option"), nullptr);
  const auto* accumulate = cli::row_of_keyword(cli::run_option_table(), "accumulate");
  ASSERT_NE(accumulate, nullptr);
  cli::RunOptions o;
  accumulate->visit_field(o, [](auto& field) {
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) field = 3;
  });
  EXPECT_EQ(o.config.accumulate, 3);
  EXPECT_EQ(accumulate->check_text("4"), "");
  EXPECT_NE(accumulate->check_text("0"), "");  // the command line's range, for keywords too
  EXPECT_EQ(cli::row_of_keyword(cli::model_option_table(), "input_requires_grad")->flag(), "--input-requires-grad");
}

}  // namespace
}  // namespace ckcheck
