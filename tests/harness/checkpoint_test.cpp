#include "ckcheck/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/torch.h>

#include <algorithm>

#include "harness/support/global_state.h"
#include "tests/support/support.h"

namespace ckcheck {
namespace {

using testing::error_of;
using torch::Tensor;

// A block with parameters and optional dropout: x -> x + fc2(dropout(gelu(fc1(x)))).
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t width, double p)
      : fc1(register_module("fc1", torch::nn::Linear(width, 2 * width))),
        fc2(register_module("fc2", torch::nn::Linear(2 * width, width))),
        drop(register_module("drop", torch::nn::Dropout(p))) {}
  Tensor forward(const Tensor& x) { return x + fc2(drop(torch::gelu(fc1(x)))); }
  torch::nn::Linear fc1, fc2;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Block);

struct Grads {
  Tensor out;
  std::vector<Tensor> params;
  Tensor input;
};

// One training step through `blocks`, each called through `call` (plain or checkpointed), with a
// random upstream gradient drawn from a seed of its own.
template <typename Call>
Grads step(std::vector<Block>& blocks, Tensor x, Call call, uint64_t seed = 7) {
  for (auto& b : blocks) b->zero_grad();
  if (x.defined() && x.is_floating_point() && !x.requires_grad()) x = x.detach().requires_grad_();
  torch::manual_seed(seed);
  Tensor h = x;
  for (auto& b : blocks) h = call(b, h);
  auto upstream = torch::randn(h.sizes(), torch::TensorOptions().dtype(h.scalar_type()));
  h.backward(upstream);
  Grads g{h.detach(), {}, x.grad()};
  for (auto& b : blocks)
    for (auto& p : b->parameters()) g.params.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
  return g;
}

Tensor plain(Block& b, const Tensor& h) { return b->forward(h); }

auto checkpointed(CheckpointOptions options = {}) {
  return [options](Block& b, const Tensor& h) {
    return checkpoint([&b](const Tensor& x) { return b->forward(x); }, h, options);
  };
}

void expect_same(const Grads& a, const Grads& b) {
  EXPECT_TENSORS_EQUAL(a.out, b.out);
  EXPECT_TENSORS_EQUAL(a.input, b.input);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) EXPECT_TENSORS_EQUAL(a.params[i], b.params[i]);
}

bool any_differs(const Grads& a, const Grads& b) {
  bool differs = !testing::tensors_differ(a.input, b.input).empty();
  for (size_t i = 0; i < a.params.size(); ++i)
    differs = differs || !testing::tensors_differ(a.params[i], b.params[i]).empty();
  return differs;
}

std::vector<Block> make_blocks(int n, int64_t width, double p) {
  torch::manual_seed(1);
  std::vector<Block> blocks;
  for (int i = 0; i < n; ++i) blocks.emplace_back(width, p);
  return blocks;
}

RC_GTEST_PROP(Checkpoint, GradientsBitwiseEqualPlain, ()) {
  const int depth = *rc::gen::inRange(1, 5);
  const int64_t width = *rc::gen::inRange(1, 17);
  const int64_t batch = *rc::gen::inRange(1, 5);
  const double p = *rc::gen::element(0.0, 0.1, 0.5);
  const uint64_t seed = *rc::gen::inRange<uint64_t>(0, 1000);
  auto blocks = make_blocks(depth, width, p);
  torch::manual_seed(seed);
  auto x = torch::randn({batch, width});
  auto ref = step(blocks, x, plain, seed);
  auto got = step(blocks, x, checkpointed(), seed);
  RC_ASSERT(!any_differs(ref, got));
  RC_ASSERT(testing::tensors_differ(ref.out, got.out).empty());
}

TEST(Checkpoint, WithoutRngPreservationDropoutGradientsDiffer) {
  auto blocks = make_blocks(2, 8, 0.5);
  auto x = torch::randn({4, 8});
  auto ref = step(blocks, x, plain);
  expect_same(ref, step(blocks, x, checkpointed()));
  EXPECT_TRUE(any_differs(ref, step(blocks, x, checkpointed(CheckpointOptions().preserve_rng_state(false)))));
}

// Draws of every kind the CPU generator serves, normal samples cached by it included.
std::vector<Tensor> draw_all_kinds() {
  return {torch::rand({5}), torch::randn({7}), torch::bernoulli(torch::full({6}, 0.5)), torch::randint(100, {4}),
          torch::empty({3}, torch::kDouble).normal_()};
}

TEST(Checkpoint, TheRngForkReplaysEveryDrawAndLeavesTheStateAsItWas) {
  // The fork the checkpoint takes copies the CPU generator as it holds its state; the tensor form
  // (RngState, what the evidence compares) must see no difference after a restore.
  torch::manual_seed(3);
  torch::randn({1});  // a normal sample may now be cached by the generator
  const auto before = RngState::capture();
  const auto fork = RngFork::capture();
  const auto first = draw_all_kinds();
  EXPECT_NE(RngState::capture(), before) << "the draws moved the generator (the control)";
  fork.restore();
  EXPECT_EQ(RngState::capture(), before);
  const auto again = draw_all_kinds();
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TENSORS_EQUAL(again[i], first[i]) << "draw " << i;
}

TEST(Checkpoint, RestoringOverTheGeneratorsOwnStateLeavesItAndOverAMovedOnePutsItBack) {
  torch::manual_seed(4);
  torch::randn({1});
  const auto before = RngState::capture();
  const auto fork = RngFork::capture();
  fork.restore_over(RngFork::capture());  // nothing drawn since: the generator holds the state
  EXPECT_EQ(RngState::capture(), before);
  const auto first = draw_all_kinds();
  const auto moved = RngFork::capture();
  EXPECT_NE(RngState::capture(), before) << "the draws moved the generator (the control)";
  fork.restore_over(moved);
  EXPECT_EQ(RngState::capture(), before);
  const auto again = draw_all_kinds();
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TENSORS_EQUAL(again[i], first[i]) << "draw " << i;
}

TEST(Checkpoint, ARecomputeDrawsFromTheForwardsStreamWhetherOrNotTheCallerDrewSince) {
  // The forward draws nothing; a recompute that does (an inconsistent function) must still draw
  // what the forward's stream gives, and leave the caller's stream where it was -- both where the
  // caller drew between forward and backward and where nothing did.
  for (const bool caller_draws : {false, true}) {
    SCOPED_TRACE(caller_draws ? "the caller drew in between" : "nothing drawn in between");
    torch::manual_seed(11);
    const auto expected = torch::rand({4});  // what the forward's stream gives
    auto x = torch::randn({4}).requires_grad_();
    Tensor drawn;
    torch::manual_seed(11);
    auto y = checkpoint(
        [&drawn](const Tensor& in) {
          if (is_recomputing()) drawn = torch::rand({4});
          return in * 2;
        },
        x);
    if (caller_draws) torch::rand({9});
    const auto caller = RngState::capture();
    y.sum().backward();
    ASSERT_TRUE(drawn.defined());
    EXPECT_TENSORS_EQUAL(drawn, expected);
    EXPECT_EQ(RngState::capture(), caller);
  }
}

TEST(Checkpoint, RecomputeLeavesTheCallersRandomStreamAlone) {
  auto blocks = make_blocks(1, 8, 0.5);
  auto x = torch::randn({4, 8});
  step(blocks, x, checkpointed());
  auto after_ckpt = torch::rand({3});
  step(blocks, x, plain);
  auto after_plain = torch::rand({3});
  EXPECT_TENSORS_EQUAL(after_ckpt, after_plain);
}

// Output dtypes of the ops a block runs, recorded by the block itself.
struct DtypeBlockImpl : torch::nn::Module {
  explicit DtypeBlockImpl(int64_t width) : fc(register_module("fc", torch::nn::Linear(width, width))) {}
  Tensor forward(const Tensor& x) {
    auto y = fc(x);
    (is_recomputing() ? recompute_dtypes : forward_dtypes).push_back(y.scalar_type());
    return torch::tanh(y).to(torch::kFloat) * 2 + x;
  }
  torch::nn::Linear fc;
  std::vector<c10::ScalarType> forward_dtypes, recompute_dtypes;
};
TORCH_MODULE(DtypeBlock);

struct AmpResult {
  Grads grads;
  std::vector<c10::ScalarType> forward, recompute;
};

AmpResult amp_step(bool checkpoint_it, bool restore) {
  torch::manual_seed(3);
  DtypeBlock block(16);
  auto x = torch::randn({4, 16}).requires_grad_();
  Tensor y;
  {
    AutocastState amp = AutocastState::capture();
    amp.cpu_enabled = true;
    amp.cpu_dtype = torch::kBFloat16;
    AutocastScope scope(amp);
    y = checkpoint_it ? checkpoint([&](const Tensor& t) { return block->forward(t); }, x,
                                   CheckpointOptions().restore_autocast(restore))
                      : block->forward(x);
  }
  y.backward(torch::randn(y.sizes()));  // outside autocast, as training loops do
  AmpResult r;
  r.grads.out = y.detach();
  r.grads.input = x.grad();
  for (auto& p : block->parameters()) r.grads.params.push_back(p.grad());
  r.forward = block->forward_dtypes;
  r.recompute = block->recompute_dtypes;
  return r;
}

TEST(Checkpoint, RestoresCpuAutocastInTheRecompute) {
  auto ref = amp_step(false, true);
  auto got = amp_step(true, true);
  expect_same(ref.grads, got.grads);
  ASSERT_EQ(got.forward.size(), 1u);
  ASSERT_EQ(got.recompute.size(), 1u);
  EXPECT_EQ(got.forward[0], torch::kBFloat16);
  EXPECT_EQ(got.recompute[0], torch::kBFloat16);
}

TEST(Checkpoint, WithoutAutocastRestoreTheRecomputeRunsInAnotherDtype) {
  auto ref = amp_step(false, true);
  auto got = amp_step(true, false);
  ASSERT_EQ(got.recompute.size(), 1u);
  EXPECT_EQ(got.forward[0], torch::kBFloat16);
  EXPECT_EQ(got.recompute[0], torch::kFloat);
  EXPECT_TRUE(any_differs(ref.grads, got.grads));
}

TEST(Checkpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
  auto blocks = make_blocks(3, 8, 0.0);
  auto x = torch::randn({4, 8});
  auto no_grad_input = [](std::vector<Block>& bs, const Tensor& x, auto call) {
    for (auto& b : bs) b->zero_grad();
    Tensor h = x;  // does not require grad
    for (auto& b : bs) h = call(b, h);
    h.backward(torch::ones_like(h) * 0.5 + torch::arange(h.numel()).view(h.sizes()) * 0.01);
    std::vector<Tensor> g;
    for (auto& b : bs)
      for (auto& p : b->parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
    return g;
  };
  auto ref = no_grad_input(blocks, x, plain);
  auto got = no_grad_input(blocks, x, checkpointed());
  ASSERT_EQ(ref.size(), got.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << "parameter " << i << " got no gradient";
    EXPECT_TENSORS_EQUAL(ref[i], got[i]);
  }
}

TEST(Checkpoint, SameModuleTwiceAccumulatesEachContributionOnce) {
  auto blocks = make_blocks(1, 8, 0.2);
  std::vector<Block> twice{blocks[0], blocks[0]};
  auto x = torch::randn({4, 8});
  expect_same(step(twice, x, plain), step(twice, x, checkpointed()));
}

TEST(Checkpoint, OutputViewChangedInPlaceKeepsItsGradient) {
  auto w = torch::randn({6}).requires_grad_();
  // pytorch#26546: the output is a view of an intermediate, changed in place inside the function;
  // in the second case the caller changes the returned view in place as well.
  auto relu_view = [&w](const Tensor& x) { return (x * w).narrow(0, 1, 4).relu_(); };
  auto add_view = [&w](const Tensor& x) { return (x * w).narrow(0, 1, 4).add_(1); };
  for (bool caller_in_place : {false, true}) {
    TensorFn fn = caller_in_place ? TensorFn(add_view) : TensorFn(relu_view);
    auto run = [&](bool ckpt) {
      w.mutable_grad() = Tensor();
      auto x = torch::linspace(-1, 1, 6).requires_grad_();
      auto y = ckpt ? checkpoint(fn, x) : fn(x);
      if (caller_in_place) y.mul_(3);
      y.backward(torch::tensor({1.0f, -2.0f, 3.0f, 0.5f}));
      return std::make_pair(x.grad(), w.grad());
    };
    auto ref = run(false);
    auto got = run(true);
    ASSERT_TRUE(got.first.defined());
    ASSERT_TRUE(got.second.defined());
    EXPECT_TENSORS_EQUAL(ref.first, got.first) << caller_in_place;
    EXPECT_TENSORS_EQUAL(ref.second, got.second) << caller_in_place;
  }
}

TEST(Checkpoint, SeveralInputsAndOutputsSomeWithoutGradient) {
  auto a = torch::randn({3, 3}), b = torch::randn({3, 3});
  auto fn = [](const std::vector<Tensor>& xs) {
    auto s = xs[0].matmul(xs[1]);
    return std::vector<Tensor>{s.sin(), s.argmax(1), xs[1].detach() * 2, xs[0] * xs[1]};
  };
  auto run = [&](bool ckpt) {
    auto x = a.clone().requires_grad_(), y = b.clone().requires_grad_();
    auto outs = ckpt ? checkpoint(TensorsFn(fn), {x, y}) : fn({x, y});
    EXPECT_FALSE(outs[1].requires_grad());
    (outs[0].sum() + (outs[3] * 3).sum()).backward();
    return std::vector<Tensor>{x.grad(), y.grad(), outs[0].detach(), outs[1], outs[2].detach()};
  };
  auto ref = run(false), got = run(true);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_TENSORS_EQUAL(ref[i], got[i]);
}

TEST(Checkpoint, RejectsNonTensorOutputs) {
  auto x = torch::randn({2}).requires_grad_();
  auto message = error_of([&] {
    checkpoint_ivalues(
        [](const std::vector<c10::IValue>& in) {
          return c10::IValue(c10::ivalue::Tuple::create({in[0], c10::IValue(int64_t{3})}));
        },
        {x}, CheckpointOptions().name("head"));
  });
  EXPECT_NE(message.find("ckcheck::checkpoint(head)"), std::string::npos) << message;
  EXPECT_NE(message.find("returned a Int at output[1]"), std::string::npos) << message;
}

TEST(Checkpoint, IValueOutputsKeepTheirStructure) {
  auto x = torch::randn({2}).requires_grad_();
  auto out = checkpoint_ivalues(
      [](const std::vector<c10::IValue>& in) {
        auto t = in[0].toTensor();
        return c10::IValue(c10::ivalue::Tuple::create({t * 2, t + in[1].toInt()}));
      },
      {x, int64_t{5}});
  auto elems = out.toTupleRef().elements();
  ASSERT_EQ(elems.size(), 2u);
  (elems[0].toTensor().sum() + elems[1].toTensor().sum()).backward();
  EXPECT_TENSORS_EQUAL(x.grad(), torch::full({2}, 3.0f));
}

// Optional tensor arguments (a mask that may be None), as nn.MultiheadAttention takes them: the
// tensors among the actual arguments are the checkpoint's inputs, None passes through.
TEST(Checkpoint, OptionalTensorArgumentsMayBeNoneOrATensor) {
  auto w = torch::randn({4, 4});
  auto fn = [](const std::vector<c10::IValue>& in) {
    auto h = torch::matmul(in[0].toTensor(), in[1].toTensor());
    if (!in[2].isNone()) h = h.masked_fill(in[2].toTensor(), 0.0);
    return c10::IValue(torch::tanh(h));
  };
  for (const bool with_mask : {false, true}) {
    const auto mask = torch::rand({2, 4}) > 0.5;
    auto run = [&](bool ckpt) {
      auto x = torch::randn({2, 4}, at::make_generator<at::CPUGeneratorImpl>(3)).requires_grad_();
      auto wr = w.clone().requires_grad_();
      const std::vector<c10::IValue> args{x, wr, with_mask ? c10::IValue(mask) : c10::IValue()};
      auto y = ckpt ? checkpoint_ivalues(fn, args, CheckpointOptions().name("attn")).toTensor() : fn(args).toTensor();
      (y * y).sum().backward();
      return std::vector<Tensor>{y.detach(), x.grad(), wr.grad()};
    };
    const auto ref = run(false), got = run(true);
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_TENSORS_EQUAL(ref[i], got[i]);
  }
}

TEST(Checkpoint, RejectsASecondBackward) {
  auto blocks = make_blocks(1, 4, 0.0);
  auto x = torch::randn({2, 4}).requires_grad_();
  auto y = checkpoint([&](const Tensor& t) { return blocks[0]->forward(t); }, x,
                      CheckpointOptions().name("blocks.0"));
  auto loss = y.sum();
  loss.backward();
  auto message = error_of([&] { loss.backward(); });
  EXPECT_NE(message.find("ckcheck::checkpoint(blocks.0): backward ran a second time"),
            std::string::npos)
      << message;
  // The control: with the graph kept, a second backward goes through, as it does without the
  // checkpoint (Conformance.ASecondBackwardWithTheGraphKeptMatchesPlain compares the values).
  auto kept = checkpoint([&](const Tensor& t) { return blocks[0]->forward(t); }, x,
                         CheckpointOptions().name("blocks.0")).sum();
  kept.backward({}, /*retain_graph=*/true);
  EXPECT_EQ(error_of([&] { kept.backward(); }), "");
}

TEST(Checkpoint, RefusesAnInputChangedInsideTheFunction) {
  auto w = torch::randn({4}).requires_grad_();
  auto x = (torch::randn({4}).requires_grad_() + 0);  // a non-leaf, as a block input is
  auto message = error_of([&] {
    checkpoint([&w](const Tensor& t) { return t.mul_(2) * w; }, x, CheckpointOptions().name("b1"));
  });
  EXPECT_NE(message.find("changed its input 0 in place"), std::string::npos) << message;
  // The control: without the check the forward goes through (and the recompute starts from the
  // doubled input, which is what the check exists to prevent).
  auto x2 = (torch::randn({4}).requires_grad_() + 0);
  EXPECT_EQ(error_of([&] {
              checkpoint([&w](const Tensor& t) { return t.mul_(2) * w; }, x2,
                         CheckpointOptions().check_input_versions(false));
            }),
            "");
}

TEST(Checkpoint, RefusesAnInputChangedBeforeTheRecompute) {
  auto w = torch::randn({4}).requires_grad_();
  auto x = torch::randn({4}).requires_grad_() + 0;
  auto y = checkpoint([&w](const Tensor& t) { return t * w; }, x, CheckpointOptions().name("b2"));
  { torch::NoGradGuard g; x.add_(1); }
  auto message = error_of([&] { y.sum().backward(); });
  EXPECT_NE(message.find("ckcheck::checkpoint(b2): input 0 was changed in place after the forward"),
            std::string::npos)
      << message;
}

TEST(Checkpoint, IsRecomputingOnlyDuringTheRecompute) {
  std::vector<bool> seen;
  auto x = torch::randn({3}).requires_grad_();
  auto y = checkpoint([&](const Tensor& t) { seen.push_back(is_recomputing()); return t.exp(); }, x);
  EXPECT_FALSE(is_recomputing());
  y.sum().backward();
  EXPECT_EQ(seen, (std::vector<bool>{false, true}));
  EXPECT_FALSE(is_recomputing());
}

TEST(Checkpoint, RestoreBuffersUpdatesRunningStatisticsOnce) {
  auto run = [](int mode) {  // 0 plain, 1 checkpointed, 2 checkpointed + restore_buffers
    torch::manual_seed(0);
    torch::nn::BatchNorm1d bn(4);
    auto x = torch::randn({8, 4}).requires_grad_();
    auto fn = [&bn](const Tensor& t) { return bn->forward(t); };
    auto y = mode == 0 ? fn(x)
                       : checkpoint(TensorFn(fn), x,
                                    mode == 2 ? CheckpointOptions().restore_buffers(
                                                    {bn->running_mean, bn->running_var,
                                                     bn->num_batches_tracked})
                                              : CheckpointOptions());
    y.backward(torch::randn(y.sizes()));
    return std::vector<Tensor>{bn->running_mean.clone(), bn->running_var.clone(),
                               bn->num_batches_tracked.clone(), x.grad()};
  };
  auto ref = run(0), twice = run(1), fixed = run(2);
  EXPECT_EQ(twice[2].item<int64_t>(), 2);  // the hazard: the recompute counts the batch again
  EXPECT_FALSE(testing::tensors_differ(ref[0], twice[0]).empty());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_TENSORS_EQUAL(ref[i], fixed[i]);
}

TEST(Checkpoint, SequentialMatchesPlain) {
  torch::manual_seed(5);
  torch::nn::Sequential seq(torch::nn::Linear(6, 6), torch::nn::Tanh(), torch::nn::Linear(6, 6),
                            torch::nn::Dropout(0.3), torch::nn::Linear(6, 6));
  auto x = torch::randn({3, 6});
  auto run = [&](int64_t segments) {
    seq->zero_grad();
    torch::manual_seed(9);
    auto in = x.clone().requires_grad_();
    auto y = segments == 0 ? seq->forward(in) : checkpoint_sequential(seq, segments, in);
    y.backward(torch::randn(y.sizes()));
    std::vector<Tensor> g{in.grad()};
    for (auto& p : seq->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  auto ref = run(0);
  for (int64_t segments : {1, 2, 3, 5}) {
    auto got = run(segments);
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_TENSORS_EQUAL(ref[i], got[i]) << segments;
  }
  EXPECT_NE(error_of([&] { checkpoint_sequential(seq, 6, x); }), "");
}

TEST(Checkpoint, ObserverSeesForwardAndRecompute) {
  struct Log : CheckpointObserver {
    std::vector<std::string> events;
    void forward_begin(const CheckpointCall& c, const std::vector<Tensor>&) override {
      events.push_back("fb:" + c.site);
    }
    void forward_end(const CheckpointCall& c, const std::vector<Tensor>&,
                     const std::vector<Tensor>&) override {
      events.push_back("fe:" + c.site);
    }
    void recompute_begin(const CheckpointCall& c, const std::vector<Tensor>&,
                         const std::vector<Tensor>& g) override {
      events.push_back("rb:" + c.site + (g[0].defined() ? "" : "(no grad)"));
    }
    void recompute_end(const CheckpointCall& c, const std::vector<Tensor>&) override {
      events.push_back("re:" + c.site);
    }
  };
  auto log = std::make_shared<Log>();
  auto x = torch::randn({3}).requires_grad_();
  auto y = checkpoint([](const Tensor& t) { return t.sin(); }, x,
                      CheckpointOptions().name("s").observer(log));
  y.sum().backward();
  EXPECT_EQ(log->events, (std::vector<std::string>{"fb:s", "fe:s", "rb:s", "re:s"}));
}

// The checkpoint's own ops (the recompute's detach of its inputs, the clone that gives a view
// output a tensor of its own, the RNG fork) stay out of an op trace: a profiler or observer sees
// the function's ops, twice, and the backward's, as in a plain step that runs the function twice.
TEST(Checkpoint, ItsOwnOpsStayOutOfAnOpTrace) {
  static thread_local std::vector<std::string>* trace = nullptr;
  torch::nn::Linear layer(4, 4);
  auto fn = [&layer](const Tensor& in) { return torch::dropout(torch::tanh(layer(in)), 0.5, true).view({-1}); };
  const auto x = torch::randn({2, 4}).requires_grad_();
  auto ops_of = [&layer, &x](const std::function<void()>& step) {
    layer->zero_grad();  // each step starts with no gradient: its accumulation's ops are the same
    x.mutable_grad().reset();
    std::vector<std::string> seen;
    trace = &seen;
    const auto handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction& f) -> std::unique_ptr<at::ObserverContext> {
          if (trace != nullptr) trace->emplace_back(f.name());
          return nullptr;
        }).scopes({at::RecordScope::FUNCTION}));
    step();
    at::removeCallback(handle);
    trace = nullptr;
    return seen;
  };
  auto count = [](const std::vector<std::string>& ops, const std::string& name) {
    return std::count(ops.begin(), ops.end(), name);
  };
  const auto plain = ops_of([&] {
    {
      torch::NoGradGuard no_grad;
      fn(x);
    }
    fn(x).sum().backward();
  });
  const auto checkpointed = ops_of([&] { checkpoint(fn, x).sum().backward(); });
  ASSERT_GT(count(plain, "aten::tanh"), 0);
  EXPECT_EQ(count(checkpointed, "aten::tanh"), count(plain, "aten::tanh"));
  for (const auto* op : {"aten::detach", "aten::clone", "aten::copy_", "aten::empty"}) {
    EXPECT_EQ(count(checkpointed, op), count(plain, op)) << op;
  }
}

}  // namespace
}  // namespace ckcheck
