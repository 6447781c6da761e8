// validate-op tells the four test ops apart: clean (safe), stateful, mutating an unannotated
// input, and drawing random numbers from the default generator (safe with the RNG replayed).
#include <fmt/ranges.h>

#include "analyses/validate_op.h"

#include <gtest/gtest.h>

#include "ckcheck_test_ops_path.h"
#include "harness/support/errors.h"

namespace ckcheck {
namespace {

OpValidation validate(const std::string& op, const std::string& shapes = "") {
  OpValidationOptions o;
  o.library = CKCHECK_TEST_OPS_LIBRARY;
  o.op = op;
  if (!shapes.empty()) o.shapes = parse_shapes(shapes);
  o.cases = 5;
  return validate_op(o);
}

std::vector<std::string> causes(const OpValidation& v) {
  std::vector<std::string> out;
  for (const auto& c : v.checks) {
    for (const auto& f : c.findings) out.push_back(c.id + ":" + cause_name(f.cause));
  }
  return out;
}

TEST(ValidateOp, CleanOpIsSafe) {
  const auto v = validate("ckcheck_test::clean");
  EXPECT_TRUE(v.safe) << ::testing::PrintToString(causes(v));
  EXPECT_TRUE(v.notes.empty());
  EXPECT_EQ(v.schema, "ckcheck_test::clean(Tensor x, Tensor y) -> Tensor");
}

TEST(ValidateOp, StatefulOpIsUnsafe) {
  const auto v = validate("ckcheck_test::stateful");
  EXPECT_FALSE(v.safe);
  EXPECT_EQ(causes(v).front(), "determinism:stateful") << ::testing::PrintToString(causes(v));
}

TEST(ValidateOp, OpThatWritesAnUnannotatedInputIsUnsafe) {
  const auto v = validate("ckcheck_test::mutating", "3x5");
  EXPECT_FALSE(v.safe);
  const auto c = causes(v);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c.front(), "input-mutation:in-place") << ::testing::PrintToString(c);
  for (const auto& check : v.checks) {
    if (check.id == "input-mutation") {
      EXPECT_EQ(check.findings.at(0).tensor, "x");
    }
  }
}

TEST(ValidateOp, RandomOpIsSafeWithItsRngReplayed) {
  const auto v = validate("ckcheck_test::random");
  EXPECT_TRUE(v.safe) << ::testing::PrintToString(causes(v));
  ASSERT_EQ(v.notes.size(), 1u);
  EXPECT_NE(v.notes[0].find("preserve_rng_state"), std::string::npos);
}

TEST(ValidateOp, TheFourAreToldApart) {
  std::set<std::string> signatures;
  for (const char* op : {"ckcheck_test::clean", "ckcheck_test::stateful", "ckcheck_test::mutating", "ckcheck_test::random"}) {
    const auto v = validate(op);
    signatures.insert(fmt::format("{}|{}|{}", v.safe, fmt::join(causes(v), ","), fmt::join(v.notes, ",")));
  }
  EXPECT_EQ(signatures.size(), 4u);
}

TEST(ValidateOp, BadInputIsAUsageError) {
  EXPECT_THROW(validate("ckcheck_test::nope"), UsageError);
  EXPECT_THROW(validate("nonamespace"), UsageError);
  EXPECT_THROW(validate("ckcheck_test::clean", "4x16"), UsageError);  // two tensor arguments
  EXPECT_THROW(parse_shapes("4y16"), UsageError);
  OpValidationOptions o;
  o.library = "/no/such/lib.so";
  o.op = "x::y";
  EXPECT_THROW(validate_op(o), UsageError);
}

}  // namespace
}  // namespace ckcheck
