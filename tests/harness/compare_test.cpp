#include "harness/runner/compare.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <limits>

#include "harness/support/errors.h"

namespace ckcheck {
namespace {

TEST(Tolerance, Parses) {
  EXPECT_TRUE(Tolerance::parse("bitwise").bitwise());
  auto t = Tolerance::parse("rtol=1e-5,atol=1e-8");
  EXPECT_EQ(t.kind, Tolerance::Kind::kClose);
  EXPECT_DOUBLE_EQ(t.rtol, 1e-5);
  EXPECT_DOUBLE_EQ(t.atol, 1e-8);
  EXPECT_EQ(Tolerance::parse("atol=0.5").text(), "rtol=0,atol=0.5");
  EXPECT_EQ(Tolerance::parse("ulp=4").ulp, 4);
  EXPECT_TRUE(Tolerance::parse("auto").automatic());
  EXPECT_EQ(Tolerance::parse("auto").text(), "auto");
  for (const std::string bad : {"", "tight", "rtol=", "rtol=x", "rtol=-1", "ulp=1.5", "ulp=", "rtol=1,foo=2", "atol=nan"}) {
    EXPECT_THROW(Tolerance::parse(bad), UsageError) << bad;
  }
}

// Under auto, a value no noise was measured for (a unit's outputs) is equal within the reordering
// error of a sum on its own scale, and not beyond.
TEST(Compare, AutoAcceptsRoundingOnTheTensorsOwnScaleOnly) {
  const auto a = torch::full({8}, 2.0f);
  auto near = a.clone();
  near[3] += 100 * 2.0f * 1.1920928955078125e-07f;  // 100 epsilons of the largest value
  auto far = a.clone();
  far[3] += 4096 * 2.0f * 1.1920928955078125e-07f;
  EXPECT_TRUE(compare_tensors(a, near, Tolerance::parse("auto")).equal);
  EXPECT_FALSE(compare_tensors(a, far, Tolerance::parse("auto")).equal);
  EXPECT_FALSE(compare_tensors(a, near, Tolerance()).equal);
}

TEST(Compare, NanInTheSamePlaceIsEqual) {
  auto a = torch::tensor({1.0f, NAN, 3.0f});
  auto d = compare_tensors(a, a.clone(), Tolerance());
  EXPECT_TRUE(d.equal);
  EXPECT_EQ(d.nonfinite_reference, 1);
  EXPECT_EQ(d.nonfinite_checkpointed, 1);
  auto b = torch::tensor({1.0f, 2.0f, NAN});
  auto e = compare_tensors(a, b, Tolerance());
  EXPECT_FALSE(e.equal);
  EXPECT_EQ(e.mismatched, 2);
  EXPECT_EQ(e.first_index, 1);
}

TEST(Compare, ReportsMagnitudesAndMissingSides) {
  auto a = torch::tensor({1.0f, 2.0f, 4.0f});
  auto b = torch::tensor({1.0f, 2.5f, 4.0f});
  auto d = compare_tensors(a, b, Tolerance());
  EXPECT_FALSE(d.equal);
  EXPECT_DOUBLE_EQ(d.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(d.max_rel, 0.25);
  EXPECT_EQ(d.first_index, 1);
  EXPECT_TRUE(compare_tensors(a, b, Tolerance::parse("atol=0.5")).equal);
  EXPECT_FALSE(compare_tensors(a, b, Tolerance::parse("atol=0.4")).equal);
  EXPECT_EQ(compare_tensors(a, torch::Tensor(), Tolerance()).missing, "checkpointed");
  EXPECT_EQ(compare_tensors(torch::Tensor(), a, Tolerance()).missing, "reference");
  EXPECT_TRUE(compare_tensors(torch::Tensor(), torch::Tensor(), Tolerance()).equal);
  auto shape = compare_tensors(a, torch::zeros({4}), Tolerance::parse("atol=100"));
  EXPECT_FALSE(shape.equal);
  EXPECT_EQ(shape.note, "shape 3 vs 4");
  auto dtype = compare_tensors(a, a.to(torch::kDouble), Tolerance());
  EXPECT_FALSE(dtype.equal);
  EXPECT_EQ(dtype.note, "dtype Float vs Double");
}

TEST(Compare, UlpDistanceCountsRepresentableSteps) {
  const float x = 1.0f;
  const float next = std::nextafter(x, 2.0f);
  const float next2 = std::nextafter(next, 2.0f);
  auto d = compare_tensors(torch::tensor({x}), torch::tensor({next2}), Tolerance::parse("ulp=2"));
  EXPECT_EQ(d.max_ulp, 2);
  EXPECT_TRUE(d.equal);
  EXPECT_FALSE(compare_tensors(torch::tensor({x}), torch::tensor({next2}), Tolerance::parse("ulp=1")).equal);
  // Across zero: -min_denorm and +min_denorm are two steps apart.
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(compare_tensors(torch::tensor({-tiny}), torch::tensor({tiny}), Tolerance()).max_ulp, 2);
  // bf16 counts bf16 steps.
  auto a16 = torch::tensor({1.0f}).to(torch::kBFloat16);
  auto b16 = torch::tensor({1.0078125f}).to(torch::kBFloat16);  // the next bf16 after 1
  EXPECT_EQ(compare_tensors(a16, b16, Tolerance()).max_ulp, 1);
}

RC_GTEST_PROP(Compare, UlpDistanceMatchesNextafterSteps, (float x, uint8_t steps)) {
  RC_PRE(std::isfinite(x));
  float y = x;
  for (int i = 0; i < steps; ++i) y = std::nextafter(y, std::numeric_limits<float>::infinity());
  RC_PRE(std::isfinite(y));
  auto d = compare_tensors(torch::tensor({x}), torch::tensor({y}), Tolerance());
  // -0 and +0 are one bit pattern apart but equal values: nextafter steps over -0 -> +0 as one.
  const bool crosses_zero = x < 0 && y >= 0;
  RC_ASSERT(std::llabs(d.max_ulp - steps) <= (crosses_zero ? 1 : 0));
  RC_ASSERT(d.equal == (x == y));
}

// The NaN and inf counts equal torch's own count, whatever the values: NaNs and infs of both signs,
// finite values large enough that their sum overflows, in float and half, the two sides identical
// or not.
RC_GTEST_PROP(Compare, NonfiniteCountsMatchTorch, (std::vector<uint8_t> kinds, bool half, bool identical)) {
  RC_PRE(!kinds.empty());
  const float inf = std::numeric_limits<float>::infinity();
  const float big = half ? 60000.0f : 3e38f;
  std::vector<float> values;
  for (size_t i = 0; i < kinds.size(); ++i) {
    const float table[] = {1.5f, -2.0f, NAN, inf, -inf, big, -big, 0.0f};
    values.push_back(table[kinds[i] % 8]);
  }
  auto a = torch::tensor(values);
  if (half) a = a.to(torch::kHalf);
  auto b = identical ? a.clone() : a.flip(0);
  const auto d = compare_tensors(a, b, Tolerance());
  RC_ASSERT(d.nonfinite_reference == (~torch::isfinite(a)).sum().item<int64_t>());
  RC_ASSERT(d.nonfinite_checkpointed == (~torch::isfinite(b)).sum().item<int64_t>());
}

TEST(Fingerprint, ChangesWithContentShapeAndDtype) {
  auto a = torch::arange(6).to(torch::kFloat);
  EXPECT_EQ(fingerprint(a), fingerprint(a.clone()));
  EXPECT_NE(fingerprint(a), fingerprint(a + 1));
  EXPECT_NE(fingerprint(a), fingerprint(a.view({2, 3})));
  EXPECT_NE(fingerprint(a), fingerprint(a.to(torch::kDouble)));
}

}  // namespace
}  // namespace ckcheck
