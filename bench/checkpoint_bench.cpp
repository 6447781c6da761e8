// The checkpoint machinery's own cost per call, on blocks so small that the arithmetic costs
// next to nothing. Compare:
//   Plain                a forward and a backward
//   PlainTwoForwards     the same plus one more forward under no-grad: what a recompute costs
//                        without any machinery
//   Checkpoint           ckcheck::checkpoint (RNG and autocast saved and replayed)
//   CheckpointNoRng      without the RNG replay
//   *Frozen              the same with the block's parameters frozen: the checkpoint's watch for
//                        captured tensors still runs on every op but finds nothing
// Checkpoint - PlainTwoForwards is the machinery's overhead per call; its difference from
// CheckpointFrozen - PlainTwoForwardsFrozen is what capturing the parameters costs.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "ckcheck/checkpoint.h"

namespace {

struct Setup {
  explicit Setup(int64_t width, bool frozen = false)
      : layer(width, width), x(torch::randn({4, width}).requires_grad_()) {
    if (frozen) {
      for (auto& p : layer->parameters()) p.requires_grad_(false);
    }
  }
  torch::Tensor block(const torch::Tensor& in) { return torch::tanh(layer(in)); }
  torch::nn::Linear layer;
  torch::Tensor x;
};

void Plain(benchmark::State& state) {
  Setup s(state.range(0));
  for (auto _ : state) {
    s.block(s.x).sum().backward();
  }
}

void TwoForwards(benchmark::State& state, bool frozen) {
  Setup s(state.range(0), frozen);
  for (auto _ : state) {
    {
      torch::NoGradGuard no_grad;
      benchmark::DoNotOptimize(s.block(s.x));
    }
    s.block(s.x).sum().backward();
  }
}

void Checkpointed(benchmark::State& state, bool frozen, const ckcheck::CheckpointOptions& options = {}) {
  Setup s(state.range(0), frozen);
  for (auto _ : state) {
    ckcheck::checkpoint([&s](const torch::Tensor& in) { return s.block(in); }, s.x, options).sum().backward();
  }
}

// Named functions, not BENCHMARK_CAPTURE: callgrind's --toggle-collect selects one by its name.
void PlainTwoForwards(benchmark::State& state) { TwoForwards(state, false); }
void PlainTwoForwardsFrozen(benchmark::State& state) { TwoForwards(state, true); }
void Checkpoint(benchmark::State& state) { Checkpointed(state, false); }
void CheckpointFrozen(benchmark::State& state) { Checkpointed(state, true); }

void CheckpointNoRng(benchmark::State& state) {
  Checkpointed(state, false, ckcheck::CheckpointOptions().preserve_rng_state(false));
}

}  // namespace

BENCHMARK(Plain)->Arg(8)->Arg(256);
BENCHMARK(PlainTwoForwards)->Arg(8)->Arg(256);
BENCHMARK(Checkpoint)->Arg(8)->Arg(256);
BENCHMARK(CheckpointNoRng)->Arg(8)->Arg(256);
BENCHMARK(PlainTwoForwardsFrozen)->Arg(8);
BENCHMARK(CheckpointFrozen)->Arg(8);

BENCHMARK_MAIN();
