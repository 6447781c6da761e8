// A user's own suite: their module, checkpointed with ckcheck::checkpoint in training and checked
// with EXPECT_CHECKPOINT_EQUIVALENT in tests.
#include <ckcheck/checkpoint.h>
#include <ckcheck/testing.h>
#include <torch/torch.h>

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(bool counts) : fc(register_module("fc", torch::nn::Linear(8, 8))), counts(counts) {
    calls = register_buffer("calls", torch::zeros({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = x + torch::tanh(fc(x));
    if (!counts) return y;
    torch::Tensor scale = 1 + 0.1 * calls;
    {
      torch::NoGradGuard no_grad;
      calls.add_(1);  // the planted fault: state that changes with every call, recompute included
    }
    return y * scale;
  }
  torch::nn::Linear fc;
  torch::Tensor calls;
  bool counts;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool faulty)
      : b0(register_module("b0", Block(false))), b1(register_module("b1", Block(faulty))) {}
  Block b0, b1;
};
TORCH_MODULE(Net);

std::unique_ptr<ckcheck::Model> model_of(Net net) {
  auto p = net.ptr();
  return ckcheck::module_model("net", p, {"b0", "b1"},
                               [p](const std::vector<torch::Tensor>& x, ckcheck::SiteRunner& sites) {
                                 auto h = sites.call("b0", [p](const torch::Tensor& t) { return p->b0(t); }, x[0]);
                                 h = sites.call("b1", [p](const torch::Tensor& t) { return p->b1(t); }, h);
                                 return std::vector<torch::Tensor>{h};
                               });
}

TEST(Consumer, CheckpointIsUsableFromUserCode) {
  torch::manual_seed(0);
  Net net(false);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto y = ckcheck::checkpoint([&](const torch::Tensor& t) { return net->b0(t); }, x);
  y.sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_TRUE(net->b0->fc->weight.grad().defined());
}

// The checkpoint under grad(), backward(inputs=) and double backward, as a user meets it: what
// plain autograd gives, and nothing accumulated that was not asked for.
std::vector<torch::Tensor> grads_of(Net& net, const torch::Tensor& x) {
  std::vector<torch::Tensor> g;
  for (const auto& p : net->b0->parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  g.push_back(x.grad().defined() ? x.grad().clone() : torch::Tensor());
  for (auto p : net->b0->parameters()) p.mutable_grad() = torch::Tensor();
  x.mutable_grad() = torch::Tensor();
  return g;
}

void expect_equal(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].defined(), want[i].defined()) << i;
    if (want[i].defined()) {
      EXPECT_TRUE(torch::allclose(got[i], want[i], tol, tol)) << i;
    }
  }
}

TEST(Consumer, CheckpointGradMatchesPlainAndAccumulatesNothing) {
  torch::manual_seed(0);
  Net net(false);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  const auto want = torch::autograd::grad({net->b0(x).sum()}, {x, net->b0->fc->weight});
  auto y = ckcheck::checkpoint([&](const torch::Tensor& t) { return net->b0(t); }, x);
  const auto got = torch::autograd::grad({y.sum()}, {x, net->b0->fc->weight});
  expect_equal(got, want, 0.0);
  for (const auto& g : grads_of(net, x)) EXPECT_FALSE(g.defined());
}

TEST(Consumer, CheckpointBackwardWithInputsFillsOnlyThose) {
  torch::manual_seed(0);
  Net net(false);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  net->b0(x).sum().backward({}, false, false, {x});
  const auto want = grads_of(net, x);
  ckcheck::checkpoint([&](const torch::Tensor& t) { return net->b0(t); }, x).sum().backward({}, false, false, {x});
  expect_equal(grads_of(net, x), want, 0.0);
}

TEST(Consumer, CheckpointDoubleBackwardMatchesPlain) {
  torch::manual_seed(0);
  Net net(false);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto penalised = [&](const torch::Tensor& y) {
    auto g = torch::autograd::grad({y.sum()}, {x}, {}, true, /*create_graph=*/true)[0];
    (y.sum() + (g * g).sum()).backward();
  };
  penalised(net->b0(x));
  const auto want = grads_of(net, x);
  penalised(ckcheck::checkpoint([&](const torch::Tensor& t) { return net->b0(t); }, x));
  expect_equal(grads_of(net, x), want, 1e-6);
}

TEST(Consumer, CleanModelIsEquivalent) {
  torch::manual_seed(0);
  auto model = model_of(Net(false));
  EXPECT_CHECKPOINT_EQUIVALENT(*model, {torch::randn({4, 8})}, ckcheck::EquivalenceOptions().policy("every:1"));
}

// Fails on purpose: the build's test runs it alone and expects the failure and its findings.
TEST(Consumer, FaultyModelIsNotEquivalent) {
  torch::manual_seed(0);
  auto model = model_of(Net(true));
  EXPECT_CHECKPOINT_EQUIVALENT(*model, {torch::randn({4, 8})}, ckcheck::EquivalenceOptions().policy("every:1"));
}
