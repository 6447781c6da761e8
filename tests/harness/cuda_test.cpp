// The CUDA side: RNG replay on every device, fp16 autocast in the recompute, the atomicAdd
// variant of faulty/nondeterministic-op, and the caching allocator's peak. Skipped, with the
// reason, where there is no GPU; they must pass where there is one.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "ckcheck/checkpoint.h"
#include "fixtures/registry.h"
#include "analyses/session.h"
#include "harness/support/global_state.h"
#include "harness/support/memory.h"
#include "tests/support/support.h"

namespace ckcheck {
namespace {

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here (CPU LibTorch or no GPU)";
  }
};

std::vector<torch::Tensor> dropout_grads(bool preserve, const torch::Device& device) {
  torch::manual_seed(0);
  torch::nn::Linear fc(16, 16);
  fc->to(device);
  auto x = torch::randn({8, 16}, device).requires_grad_();
  auto fn = [&](const torch::Tensor& t) { return torch::dropout(fc(t), 0.5, true); };
  torch::manual_seed(1);
  auto plain = fn(x);
  plain.backward(torch::ones_like(plain));
  std::vector<torch::Tensor> ref{x.grad().clone(), fc->weight.grad().clone()};
  x.mutable_grad() = torch::Tensor();
  fc->zero_grad();
  torch::manual_seed(1);
  auto y = checkpoint(TensorFn(fn), x, CheckpointOptions().preserve_rng_state(preserve));
  y.backward(torch::ones_like(y));
  return {ref[0], x.grad(), ref[1], fc->weight.grad()};
}

TEST_F(Cuda, RngIsReplayedOnTheDevice) {
  auto g = dropout_grads(true, torch::kCUDA);
  EXPECT_TENSORS_EQUAL(g[0], g[1]);
  EXPECT_TENSORS_EQUAL(g[2], g[3]);
  auto off = dropout_grads(false, torch::kCUDA);
  EXPECT_FALSE(testing::tensors_differ(off[0], off[1]).empty()) << "the negative control";
}

TEST_F(Cuda, EveryDevicesGeneratorIsSaved) {
  // Use every device first: the checkpoint saves the generators of initialised devices only.
  for (int d = 0; d < static_cast<int>(torch::cuda::device_count()); ++d) {
    torch::rand({4}, torch::Device(torch::kCUDA, d));
  }
  const auto before = RngState::capture();
  EXPECT_EQ(before.cuda.size(), static_cast<size_t>(torch::cuda::device_count()));
  for (int d = 0; d < static_cast<int>(torch::cuda::device_count()); ++d) {
    torch::rand({4}, torch::Device(torch::kCUDA, d));
  }
  EXPECT_NE(RngState::capture(), before);
  before.restore();
  EXPECT_EQ(RngState::capture(), before);
}

TEST_F(Cuda, Fp16AutocastIsRestoredInTheRecompute) {
  for (bool restore : {true, false}) {
    torch::manual_seed(0);
    torch::nn::Linear fc(16, 16);
    fc->to(torch::kCUDA);
    auto x = torch::randn({8, 16}, torch::kCUDA).requires_grad_();
    std::vector<c10::ScalarType> seen;
    auto fn = [&](const torch::Tensor& t) {
      auto y = fc(t);
      seen.push_back(y.scalar_type());
      return y.to(torch::kFloat).tanh();
    };
    torch::Tensor y;
    {
      AutocastState amp = AutocastState::capture();
      amp.cuda_enabled = true;
      amp.cuda_dtype = torch::kHalf;
      AutocastScope scope(amp);
      y = checkpoint(TensorFn(fn), x, CheckpointOptions().restore_autocast(restore));
    }
    y.sum().backward();
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[0], torch::kHalf);
    EXPECT_EQ(seen[1], restore ? torch::kHalf : torch::kFloat) << "restore_autocast " << restore;
  }
}

TEST_F(Cuda, AtomicAddOpIsFoundNonDeterministic) {
#ifndef CKCHECK_WITH_CUDA
  GTEST_SKIP() << "this build has no CUDA kernels";
#endif
  auto model = make_model("faulty/nondeterministic-op", {{"hidden", "256"}}, 0);
  RunConfig config;
  config.device = torch::kCUDA;
  Runner runner(*model, config);
  const auto plan = Plan::make(*model, {}, Policy::parse("every:1"));
  const auto outcome = run_checks(runner, plan, Tolerance(), select_checks({"determinism"}));
  ASSERT_EQ(outcome.results.size(), 1u);
  EXPECT_EQ(outcome.results[0].status, Status::kFail) << outcome.results[0];
}

TEST_F(Cuda, CachingAllocatorPeakIsMeasured) {
  auto& meter = MemoryMeter::of(torch::kCUDA);
  meter.reset_peak();
  const auto before = meter.current_bytes();
  { auto big = torch::empty({1 << 20}, torch::TensorOptions().device(torch::kCUDA)); }
  EXPECT_GE(meter.peak_bytes() - before, int64_t{4} << 20);
}

TEST_F(Cuda, TransformerRunsBitwiseOnTheGpu) {
  auto model = make_model("transformer", {}, 0);
  RunConfig config;
  config.device = torch::kCUDA;
  Runner runner(*model, config);
  const auto plan = Plan::make(*model, {}, Policy::parse("every:1"));
  const auto outcome = run_checks(runner, plan, Tolerance(), select_checks({"gradients", "rng"}));
  for (const auto& r : outcome.results) EXPECT_EQ(r.status, Status::kPass) << r;
}

}  // namespace
}  // namespace ckcheck
