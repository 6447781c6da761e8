// The behaviours PyTorch's own checkpoint tests pin down, as ckcheck::checkpoint must keep them:
// each compares a checkpointed computation with the same computation under plain autograd, or
// with the error the checkpoint documents (checkpoint.h).
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ckcheck/checkpoint.h"
#include "harness/support/memory.h"
#include "tests/support/support.h"

namespace ckcheck {
namespace {

using testing::error_of;
using torch::Tensor;

class Conformance : public testing::SeededTest {};

// A small function with parameters: tanh(lin(x)) * 2.
struct Net {
  mutable torch::nn::Linear lin{torch::nn::LinearOptions(6, 6)};
  Tensor operator()(const Tensor& x) const { return torch::tanh(lin(x)) * 2; }
  std::vector<Tensor> grads() const {
    std::vector<Tensor> g;
    for (const auto& p : lin->parameters()) g.push_back(p.grad());
    return g;
  }
  void zero() { lin->zero_grad(); }
};

Tensor via_checkpoint(const Net& net, const Tensor& x) {
  return checkpoint([&net](const Tensor& t) { return net(t); }, x);
}

// What each of x and the parameters holds in .grad (undefined where nothing was accumulated).
std::vector<Tensor> grads_of(const Net& net, const Tensor& x) {
  auto g = net.grads();
  g.push_back(x.grad());
  return g;
}

void expect_same_grads(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].defined(), want[i].defined()) << what << ": .grad " << i << " defined differs from plain";
    if (want[i].defined()) {
      EXPECT_TENSORS_EQUAL(got[i], want[i]) << what << ": .grad " << i;
    }
  }
}

TEST_F(Conformance, GradOfAnInputMatchesPlainAndFillsNoGrad) {
  Net net;
  auto x = torch::randn({3, 6}, torch::requires_grad());
  const auto want = torch::autograd::grad({net(x).sum()}, {x})[0];
  const auto untouched = grads_of(net, x);
  for (const auto& g : untouched) ASSERT_FALSE(g.defined()) << "plain grad() filled a .grad";
  const auto got = torch::autograd::grad({via_checkpoint(net, x).sum()}, {x})[0];
  EXPECT_TENSORS_EQUAL(got, want);
  expect_same_grads(grads_of(net, x), untouched, "grad(y, x)");
}

TEST_F(Conformance, GradOfAParameterInsideMatchesPlain) {
  Net net;
  auto x = torch::randn({3, 6}, torch::requires_grad());
  const auto want = torch::autograd::grad({net(x).sum()}, {net.lin->weight, x});
  const auto got = torch::autograd::grad({via_checkpoint(net, x).sum()}, {net.lin->weight, x});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TENSORS_EQUAL(got[0], want[0]);
  EXPECT_TENSORS_EQUAL(got[1], want[1]);
  for (const auto& g : grads_of(net, x)) EXPECT_FALSE(g.defined()) << "grad() accumulated into a .grad";
}

TEST_F(Conformance, BackwardWithInputsFillsOnlyThoseAsPlainDoes) {
  for (int which = 0; which < 3; ++which) {  // x alone, the weight alone, both
    Net net;
    auto x = torch::randn({3, 6}, torch::requires_grad());
    auto asked = [&]() -> std::vector<Tensor> {
      if (which == 0) return {x};
      if (which == 1) return {net.lin->weight};
      return {x, net.lin->weight};
    };
    net(x).sum().backward({}, false, false, asked());
    const auto want = grads_of(net, x);
    net.zero();
    x.mutable_grad() = Tensor();
    via_checkpoint(net, x).sum().backward({}, false, false, asked());
    expect_same_grads(grads_of(net, x), want, "backward(inputs=) case " + std::to_string(which));
  }
}

TEST_F(Conformance, DoubleBackwardAGradientPenaltyMatchesPlain) {
  Net net;
  auto x = torch::randn({3, 6}, torch::requires_grad());
  auto penalised = [&](bool checkpointed) {
    auto y = checkpointed ? via_checkpoint(net, x) : net(x);
    auto g = torch::autograd::grad({y.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    EXPECT_TRUE(g.requires_grad());
    ((y * y).sum() + (g * g).sum()).backward();
  };
  penalised(false);
  const auto want = grads_of(net, x);
  for (const auto& g : want) ASSERT_TRUE(g.defined());
  net.zero();
  x.mutable_grad() = Tensor();
  penalised(true);
  const auto got = grads_of(net, x);
  // The same arithmetic; only the order in which the engine adds the two paths' contributions
  // into a .grad may differ, and the kernels (AVX2 or AVX-512) round each sum in their own order:
  // a few float roundings of the gradient's largest element apart, where a lost path would be
  // of the order of the gradient itself.
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << i;
    const double scale = want[i].abs().max().item<double>();
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-5, 1e-5 * scale)) << i << "\n" << got[i] - want[i];
  }
}

TEST_F(Conformance, ASecondBackwardWithTheGraphKeptMatchesPlain) {
  Net net;
  auto x = torch::randn({3, 6}, torch::requires_grad());
  auto twice = [&](bool checkpointed) {
    auto loss = (checkpointed ? via_checkpoint(net, x) : net(x)).sum();
    loss.backward({}, /*retain_graph=*/true);
    loss.backward();
  };
  twice(false);
  const auto want = grads_of(net, x);
  net.zero();
  x.mutable_grad() = Tensor();
  twice(true);
  expect_same_grads(grads_of(net, x), want, "two backwards, the graph kept");
}

TEST_F(Conformance, ATensorTheFunctionCapturesGetsItsGradientOnce) {
  // h comes from the caller's graph, is read by the function without being passed to it, and is
  // used after it too: its graph must run once, after both uses sent their gradients.
  torch::nn::Linear stem(6, 6);
  Net net;
  auto x = torch::randn({3, 6});
  int fires = 0;
  stem->weight.register_hook([&fires](Tensor g) {
    ++fires;
    return g;
  });
  auto run = [&](bool checkpointed) {
    auto h = stem(x);
    auto y = checkpointed ? checkpoint([&](const Tensor& t) { return net(t) * h; }, x) : net(x) * h;
    (y + h).sum().backward();
  };
  run(false);
  const auto want = net.grads();
  const auto want_stem = stem->weight.grad().clone();
  ASSERT_EQ(fires, 1);
  net.zero();
  stem->zero_grad();
  fires = 0;
  run(true);
  expect_same_grads(net.grads(), want, "captured tensor");
  EXPECT_TENSORS_EQUAL(stem->weight.grad(), want_stem);
  EXPECT_EQ(fires, 1) << "the captured tensor's graph ran " << fires << " times";
}

TEST_F(Conformance, ManyCapturedParametersEachGetTheirGradientOnce) {
  // More parameters than the watch keeps in its short list, each read twice, some before and some
  // after the list grows into a set: every one must be captured once, none twice, none missed.
  std::vector<Tensor> params;
  for (int i = 0; i < 45; ++i) params.push_back(torch::randn({4}, torch::requires_grad()));
  auto f = [&params](const Tensor& x) {
    Tensor y = x;
    for (const auto& p : params) y = y * p;
    for (auto it = params.rbegin(); it != params.rend(); ++it) y = y + *it;
    return y;
  };
  auto x = torch::randn({4});
  f(x).sum().backward();
  std::vector<Tensor> want;
  for (auto& p : params) {
    want.push_back(p.grad().clone());
    p.mutable_grad().reset();
  }
  checkpoint(f, x).sum().backward();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined()) << "parameter " << i << " got no gradient";
    EXPECT_TENSORS_EQUAL(params[i].grad(), want[i]) << "parameter " << i;
  }
}

TEST_F(Conformance, ParametersGetTheirGradientsWithRecordFunctionOff) {
  // The captured tensors are found through RecordFunction; a caller that turned it off must not
  // lose the parameters' gradients.
  Net net;
  auto x = torch::randn({3, 6});
  net(x).sum().backward();
  const auto want = net.grads();
  net.zero();
  {
    at::DisableRecordFunctionGuard off;
    via_checkpoint(net, x).sum().backward();
  }
  expect_same_grads(net.grads(), want, "RecordFunction off");
}

TEST_F(Conformance, NothingRequiresGradGivesOutputsWithoutGraphAsPlainDoes) {
  torch::nn::Linear lin(6, 6);
  lin->weight.requires_grad_(false);
  lin->bias.requires_grad_(false);
  auto x = torch::randn({3, 6});
  ASSERT_FALSE(lin(x).requires_grad());
  EXPECT_FALSE(checkpoint([&](const Tensor& t) { return lin(t); }, x).requires_grad());
}

TEST_F(Conformance, OnlySomeOutputsUsedByTheLoss) {
  torch::nn::Linear lin(6, 6);
  auto f = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{lin(in[0]), torch::sin(in[0])}; };
  auto x = torch::randn({3, 6}, torch::requires_grad());
  f({x})[0].sum().backward();
  const auto want_w = lin->weight.grad().clone();
  const auto want_x = x.grad().clone();
  lin->zero_grad();
  x.mutable_grad() = Tensor();
  checkpoint(f, {x})[0].sum().backward();
  EXPECT_TENSORS_EQUAL(lin->weight.grad(), want_w);
  EXPECT_TENSORS_EQUAL(x.grad(), want_x);
}

TEST_F(Conformance, InputsOfWhichNoneSomeOrAllRequireGrad) {
  for (int mask = 0; mask < 4; ++mask) {
    torch::nn::Linear lin(6, 6);
    auto make = [&](int bit) { return torch::randn({3, 6}).requires_grad_((mask >> bit) & 1); };
    auto a = make(0), b = make(1);
    auto f = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{lin(in[0] * in[1])}; };
    f({a, b})[0].sum().backward();
    const auto want_w = lin->weight.grad().clone();
    const auto want_a = a.grad().defined() ? a.grad().clone() : Tensor();
    lin->zero_grad();
    a.mutable_grad() = Tensor();
    checkpoint(f, {a, b})[0].sum().backward();
    EXPECT_TENSORS_EQUAL(lin->weight.grad(), want_w) << "mask " << mask;
    EXPECT_EQ(a.grad().defined(), want_a.defined()) << "mask " << mask;
    if (want_a.defined()) {
      EXPECT_TENSORS_EQUAL(a.grad(), want_a);
    }
  }
}

TEST_F(Conformance, NonFloatingInputsAndOutputs) {
  torch::nn::Embedding embed(10, 4);
  auto ids = torch::randint(10, {5}, torch::kLong);
  auto f = [&](const std::vector<Tensor>& in) {
    auto e = embed(in[0]);
    return std::vector<Tensor>{e, e.argmax(1)};
  };
  f({ids})[0].sum().backward();
  const auto want = embed->weight.grad().clone();
  embed->zero_grad();
  auto outs = checkpoint(f, {ids});
  EXPECT_FALSE(outs[1].is_floating_point());
  EXPECT_FALSE(outs[1].requires_grad());
  outs[0].sum().backward();
  EXPECT_TENSORS_EQUAL(embed->weight.grad(), want);
}

TEST_F(Conformance, AnInputReturnedUnchanged) {
  auto f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0], in[0] * 3}; };
  auto x = torch::randn({4}, torch::requires_grad());
  auto plain = f({x});
  (plain[0] * 2 + plain[1]).sum().backward();
  const auto want = x.grad().clone();
  x.mutable_grad() = Tensor();
  auto outs = checkpoint(f, {x});
  EXPECT_NE(outs[0].unsafeGetTensorImpl(), x.unsafeGetTensorImpl()) << "an input handed back must not alias it";
  (outs[0] * 2 + outs[1]).sum().backward();
  EXPECT_TENSORS_EQUAL(x.grad(), want);
}

TEST_F(Conformance, ATensorFromOutsideReturnedAsIsGetsItsGradientAndStaysALeaf) {
  // The function hands back a parameter it did not compute with (as a module returning its bias
  // for the caller to add): plain autograd gives the parameter its gradient through that output.
  auto w = torch::randn({4}, torch::requires_grad());
  auto f = [&w](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2, w}; };
  auto x = torch::randn({4}, torch::requires_grad());
  auto run = [&](bool checkpointed) {
    w.mutable_grad() = Tensor();
    x.mutable_grad() = Tensor();
    auto outs = checkpointed ? checkpoint(f, {x}) : f({x});
    (outs[0] * outs[1]).sum().backward();
    return std::vector<Tensor>{x.grad(), w.grad()};
  };
  const auto want = run(false);
  const auto got = run(true);
  EXPECT_TRUE(w.is_leaf()) << "the parameter must stay a leaf";
  expect_same_grads(got, want, "returned parameter");
}

TEST_F(Conformance, NestedCheckpoints) {
  Net inner, outer;
  auto x = torch::randn({3, 6}, torch::requires_grad());
  outer(inner(x)).sum().backward();
  const auto want_in = inner.grads(), want_out = outer.grads();
  const auto want_x = x.grad().clone();
  inner.zero();
  outer.zero();
  x.mutable_grad() = Tensor();
  auto y = checkpoint([&](const Tensor& t) { return outer(via_checkpoint(inner, t)); }, x);
  y.sum().backward();
  for (size_t i = 0; i < want_in.size(); ++i) EXPECT_TENSORS_EQUAL(inner.grads()[i], want_in[i]);
  for (size_t i = 0; i < want_out.size(); ++i) EXPECT_TENSORS_EQUAL(outer.grads()[i], want_out[i]);
  EXPECT_TENSORS_EQUAL(x.grad(), want_x);
}

// A function that turns grad mode back on and checkpoints a part of itself: the inner call's
// forward runs while the outer one's still watches, and each finds the parameters it read.
TEST_F(Conformance, ACheckpointUnderGradModeInsideAnotherMatchesPlain) {
  Net inner, outer;
  auto x = torch::randn({3, 6}, torch::requires_grad());
  auto body = [&](const Tensor& t, bool checkpointed) {
    torch::AutoGradMode on(true);
    return outer(checkpointed ? via_checkpoint(inner, t) : inner(t));
  };
  body(x, false).sum().backward();
  const auto want_in = inner.grads(), want_out = outer.grads();
  const auto want_x = x.grad().clone();
  inner.zero();
  outer.zero();
  x.mutable_grad() = Tensor();
  checkpoint([&](const Tensor& t) { return body(t, true); }, x).sum().backward();
  expect_same_grads(inner.grads(), want_in, "inner parameters");
  expect_same_grads(outer.grads(), want_out, "outer parameters");
  EXPECT_TENSORS_EQUAL(x.grad(), want_x);
}

// A function whose output is itself a gradient -- forces as the derivative of an energy, computed
// under grad mode with create_graph -- trains its parameters through the checkpoint as through
// plain autograd.
TEST_F(Conformance, AGradientComputedInsideTheFunctionMatchesPlain) {
  Net energy;
  auto pos = torch::randn({3, 6}, torch::requires_grad());
  auto forces = [&](const Tensor& p) {
    torch::AutoGradMode on(true);
    return -torch::autograd::grad({energy(p).sum()}, {p}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  };
  forces(pos).pow(2).sum().backward();
  const auto want = grads_of(energy, pos);
  energy.zero();
  pos.mutable_grad() = Tensor();
  checkpoint(forces, pos).pow(2).sum().backward();
  expect_same_grads(grads_of(energy, pos), want, "forces");
}

// Parameters an op reads only inside a list argument (cat's and stack's tensor lists) get their
// gradients through the checkpoint as through plain autograd.
TEST_F(Conformance, ParametersReadOnlyInsideATensorListGetTheirGradients) {
  auto w = torch::randn({2, 6}, torch::requires_grad());
  auto v = torch::randn({6}, torch::requires_grad());
  auto x = torch::randn({3, 6}, torch::requires_grad());
  auto f = [&](const Tensor& t) { return torch::tanh(torch::cat({t, w})) * torch::stack({v, v}).sum(0); };
  f(x).pow(2).sum().backward();
  const std::vector<Tensor> want{w.grad().clone(), v.grad().clone(), x.grad().clone()};
  for (auto* t : {&w, &v, &x}) t->mutable_grad() = Tensor();
  checkpoint(f, x).pow(2).sum().backward();
  expect_same_grads({w.grad(), v.grad(), x.grad()}, want, "tensor-list inputs");
}

// A custom autograd Function inside the checkpointed function: y = x^3 with a hand-written backward.
struct Cube : torch::autograd::Function<Cube> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x * x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    auto x = ctx->get_saved_variables()[0];
    return {g[0] * 3 * x * x};
  }
};

TEST_F(Conformance, CustomAutogradFunctionInside) {
  Net net;
  auto x = torch::randn({3, 6}, torch::requires_grad());
  Cube::apply(net(x)).sum().backward();
  const auto want = net.grads();
  const auto want_x = x.grad().clone();
  net.zero();
  x.mutable_grad() = Tensor();
  checkpoint([&](const Tensor& t) { return Cube::apply(net(t)); }, x).sum().backward();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TENSORS_EQUAL(net.grads()[i], want[i]);
  EXPECT_TENSORS_EQUAL(x.grad(), want_x);
}

TEST_F(Conformance, SequentialWithOneModuleAndOneSegment) {
  for (const auto& [modules, segments] : std::vector<std::pair<int, int>>{{1, 1}, {4, 1}, {4, 4}, {5, 2}}) {
    torch::nn::Sequential seq;
    for (int i = 0; i < modules; ++i) seq->push_back(torch::nn::Linear(5, 5));
    auto x = torch::randn({2, 5}, torch::requires_grad());
    seq->forward(x).sum().backward();
    std::vector<Tensor> want;
    for (const auto& p : seq->parameters()) want.push_back(p.grad().clone());
    const auto want_x = x.grad().clone();
    seq->zero_grad();
    x.mutable_grad() = Tensor();
    checkpoint_sequential(seq, segments, x).sum().backward();
    const auto params = seq->parameters();
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_TENSORS_EQUAL(params[i].grad(), want[i]) << modules << " modules, " << segments << " segments";
    EXPECT_TENSORS_EQUAL(x.grad(), want_x);
  }
}

TEST_F(Conformance, SequentialWithMoreSegmentsThanModulesIsRefused) {
  // torch.utils.checkpoint.checkpoint_sequential fails here with a bare range() error.
  torch::nn::Sequential seq(torch::nn::Linear(5, 5), torch::nn::Linear(5, 5));
  auto x = torch::randn({2, 5}, torch::requires_grad());
  const auto message = error_of([&] { checkpoint_sequential(seq, 3, x); });
  EXPECT_NE(message.find("segments must be between 1 and the number of modules (2), got 3"), std::string::npos)
      << message;
  EXPECT_EQ(error_of([&] { checkpoint_sequential(seq, 2, x); }), "");  // negative control
}

TEST_F(Conformance, ARecomputeOfAnotherShapeIsReported) {
  int calls = 0;
  auto f = [&](const Tensor& x) { return ++calls == 1 ? x * 2 : torch::cat({x, x}) * 2; };
  auto x = torch::randn({3}, torch::requires_grad());
  auto y = checkpoint(f, x);
  const auto message = error_of([&] { y.sum().backward(); });
  EXPECT_NE(message.find("the recompute's output 0 is"), std::string::npos) << message;
  // Negative control: the same function computing the same shape both times is accepted.
  calls = 5;
  auto same = [&](const Tensor& t) { return torch::cat({t, t}) * 2; };
  EXPECT_EQ(error_of([&] { checkpoint(same, x).sum().backward(); }), "");
}

TEST_F(Conformance, ARecomputeWithAnotherOutputCountIsReported) {
  int calls = 0;
  auto f = [&](const std::vector<Tensor>& in) {
    return ++calls == 1 ? std::vector<Tensor>{in[0] * 2} : std::vector<Tensor>{in[0] * 2, in[0]};
  };
  auto x = torch::randn({3}, torch::requires_grad());
  auto y = checkpoint(f, {x});
  EXPECT_NE(error_of([&] { y[0].sum().backward(); }).find("the recompute returned 2 outputs"), std::string::npos);
}

TEST_F(Conformance, ParameterHooksFireOncePerBackward) {
  Net net;
  int fires = 0;
  net.lin->weight.register_hook([&fires](Tensor g) {
    ++fires;
    return g;
  });
  auto x = torch::randn({3, 6}, torch::requires_grad());
  net(x).sum().backward();
  EXPECT_EQ(fires, 1);  // negative control: plain fires once
  fires = 0;
  via_checkpoint(net, x).sum().backward();
  EXPECT_EQ(fires, 1);
}

TEST_F(Conformance, ActivationsAreFreedBetweenForwardAndBackward) {
  install_cpu_tracking_allocator();
  auto& meter = MemoryMeter::of(torch::kCPU);
  // Blocks whose inner activations (512 x 256) are four times their input and output (512 x 64).
  std::vector<torch::nn::Sequential> blocks;
  for (int i = 0; i < 4; ++i)
    blocks.emplace_back(torch::nn::Linear(64, 256), torch::nn::Tanh(), torch::nn::Linear(256, 64), torch::nn::Tanh());
  auto x = torch::randn({512, 64}, torch::requires_grad());
  auto held_after_forward = [&](bool checkpointed) {
    const auto before = meter.current_bytes();
    Tensor h = x;
    for (auto& b : blocks) {
      h = checkpointed ? checkpoint([&b](const Tensor& t) { return b->forward(t); }, h) : b->forward(h);
    }
    const auto held = meter.current_bytes() - before;
    h.sum().backward();
    return held;
  };
  const auto plain = held_after_forward(false);
  const auto checkpointed = held_after_forward(true);
  EXPECT_GT(plain, 0);
  // Plain keeps every block's activations; checkpointed only each block's output.
  EXPECT_LT(checkpointed, plain / 4) << "plain " << plain << " B, checkpointed " << checkpointed << " B";
}

// Records the graph task its backward runs in.
struct TaskProbe : torch::autograd::Function<TaskProbe> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x, int* task) {
    ctx->saved_data["task"] = reinterpret_cast<int64_t>(task);
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    *reinterpret_cast<int*>(ctx->saved_data["task"].toInt()) = torch::autograd::get_current_graph_task_id();
    return {g[0], Tensor()};
  }
};

TEST_F(Conformance, TheSegmentIsDifferentiatedInTheCallersGraphTask) {
  Net net;
  auto x = torch::randn({3, 6}, torch::requires_grad());
  int outside = -1, inside = -2;
  auto y = checkpoint([&](const Tensor& t) { return TaskProbe::apply(net(t), &inside); }, x);
  TaskProbe::apply(y, &outside).sum().backward();
  ASSERT_GE(outside, 0);
  EXPECT_EQ(inside, outside) << "the recomputed segment ran in a graph task of its own";
  // Negative control: grad() with inputs keeps the engine path, which differentiates the segment
  // in a task of its own.
  outside = -1;
  inside = -2;
  auto y2 = checkpoint([&](const Tensor& t) { return TaskProbe::apply(net(t), &inside); }, x);
  torch::autograd::grad({TaskProbe::apply(y2, &outside).sum()}, {x});
  EXPECT_NE(inside, outside);
}

TEST_F(Conformance, HooksInsideTheFunctionChangeGradientsAsInPlain) {
  Net net;
  int fires = 0;
  auto f = [&](const Tensor& t) {
    auto h = net.lin(t);
    if (h.requires_grad()) {
      h.register_hook([&fires](Tensor g) {
        ++fires;
        return g * 3;
      });
    }
    return torch::tanh(h) * 2;
  };
  auto x = torch::randn({3, 6}, torch::requires_grad());
  f(x).sum().backward();
  const auto want = grads_of(net, x);
  ASSERT_EQ(fires, 1);
  for (auto& g : want) ASSERT_TRUE(g.defined());
  std::vector<Tensor> kept;
  for (const auto& g : want) kept.push_back(g.clone());
  net.zero();
  x.mutable_grad() = Tensor();
  fires = 0;
  checkpoint(f, x).sum().backward();
  EXPECT_EQ(fires, 1) << "the hook runs once, in the recompute's backward";
  expect_same_grads(grads_of(net, x), kept, "hook inside");
}

TEST_F(Conformance, OutputsOfOneOpAndBranchingGradientsMatchPlain) {
  torch::nn::Linear lin(6, 8);
  auto f = [&](const std::vector<Tensor>& in) {
    auto parts = lin(in[0]).chunk(2, -1);  // two outputs of one op
    auto a = torch::sin(in[0]) * in[1];    // x reached by two paths, w used twice
    return std::vector<Tensor>{parts[0] * parts[1] + lin(a).narrow(-1, 0, 4), parts[1]};
  };
  auto x = torch::randn({3, 6}, torch::requires_grad());
  auto s = torch::randn({3, 6}, torch::requires_grad());
  auto loss = [](const std::vector<Tensor>& o) { return (o[0] * 1.5 + o[1].cos()).sum(); };
  loss(f({x, s})).backward();
  std::vector<Tensor> want{lin->weight.grad().clone(), lin->bias.grad().clone(), x.grad().clone(), s.grad().clone()};
  lin->zero_grad();
  x.mutable_grad() = Tensor();
  s.mutable_grad() = Tensor();
  loss(checkpoint(f, {x, s})).backward();
  std::vector<Tensor> got{lin->weight.grad(), lin->bias.grad(), x.grad(), s.grad()};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TENSORS_EQUAL(got[i], want[i]) << "gradient " << i;
}

TEST_F(Conformance, AnOutputNoGradientReachesGivesItsParametersNone) {
  torch::nn::Linear used(6, 6), unused(6, 6);
  auto f = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{used(in[0]), unused(in[0])}; };
  auto x = torch::randn({3, 6}, torch::requires_grad());
  f({x})[0].sum().backward();
  ASSERT_FALSE(unused->weight.grad().defined());  // negative control: plain leaves it without a gradient
  const auto want = used->weight.grad().clone();
  used->zero_grad();
  checkpoint(f, {x})[0].sum().backward();
  EXPECT_TENSORS_EQUAL(used->weight.grad(), want);
  EXPECT_FALSE(unused->weight.grad().defined()) << "a parameter only the unused output reads got a gradient";
}

// Four 256x256 layers over a batch of 4: their weights' gradients (256 KiB each) dwarf the
// activations (4 KiB each).
struct WideLayers {
  mutable std::vector<torch::nn::Linear> layers{torch::nn::Linear(256, 256), torch::nn::Linear(256, 256),
                                        torch::nn::Linear(256, 256), torch::nn::Linear(256, 256)};
  Tensor operator()(Tensor h) const {
    for (auto& l : layers) h = torch::tanh(l(h));
    return h;
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> ps;
    for (const auto& l : layers) {
      for (const auto& p : l->parameters()) ps.push_back(p);
    }
    return ps;
  }
  // Gradients that already hold something (as after an earlier micro-batch): the order in which
  // contributions are added to them shows in the last bits.
  void fill_grads(uint64_t seed) {
    torch::manual_seed(seed);
    for (auto& p : parameters()) p.mutable_grad() = torch::randn_like(p);
  }
  std::vector<Tensor> grads() const {
    std::vector<Tensor> g;
    for (const auto& p : parameters()) g.push_back(p.grad().clone());
    return g;
  }
};

TEST_F(Conformance, ParameterGradientsAreAccumulatedAsTheSegmentCompletesThem) {
  // Plain autograd adds each weight's gradient to .grad as soon as it is made; the checkpoint must
  // not hold the whole segment's parameter gradients until its backward ends.
  install_cpu_tracking_allocator();
  auto& meter = MemoryMeter::of(torch::kCPU);
  WideLayers net;
  auto x = torch::randn({4, 256}, torch::requires_grad());
  auto backward_peak = [&](bool checkpointed) {
    net.fill_grads(1);
    auto y = checkpointed ? checkpoint([&net](const Tensor& t) { return net(t); }, x) : net(x);
    auto loss = y.sum();
    meter.reset_peak();
    const auto before = meter.current_bytes();
    loss.backward();
    return meter.peak_bytes() - before;
  };
  const auto plain = backward_peak(false);
  const auto want = net.grads();
  const auto checkpointed = backward_peak(true);
  const auto got = net.grads();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TENSORS_EQUAL(got[i], want[i]) << "parameter " << i;
  const int64_t weight_grad = 256 * 256 * 4;
  EXPECT_GT(plain, weight_grad / 2);  // negative control: plain's peak is about one weight's gradient
  EXPECT_LT(checkpointed, plain + weight_grad / 2)
      << "plain backward peaks " << plain << " B above its start, checkpointed " << checkpointed << " B";
}

TEST_F(Conformance, AParameterUsedInsideAndOutsideGetsPlainsGradientOnce) {
  // w reaches the loss through the segment and around it: plain autograd sums both gradients and
  // adds the sum to .grad once, and so must the checkpoint (adding each alone rounds otherwise).
  WideLayers net;
  auto x = torch::randn({4, 256}, torch::requires_grad());
  const auto& w = net.layers[0]->weight;
  auto run = [&](bool checkpointed) {
    net.fill_grads(1);
    auto y = checkpointed ? checkpoint([&net](const Tensor& t) { return net(t); }, x) : net(x);
    (y.sum() + torch::mm(x, w).pow(2).sum()).backward();
  };
  run(false);
  const auto want = net.grads();
  run(true);
  const auto got = net.grads();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TENSORS_EQUAL(got[i], want[i]) << "parameter " << i;
}

}  // namespace
}  // namespace ckcheck
