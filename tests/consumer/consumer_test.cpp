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

// The checkpoint's contract under grad(), backward(inputs=) and double backward, as a user meets
// it: refused with one line before anything is accumulated (checkpoint.h).
std::string refusal_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(Consumer, CheckpointRefusesGradAndLeavesEveryGradUntouched) {
  torch::manual_seed(0);
  Net net(false);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto y = ckcheck::checkpoint([&](const torch::Tensor& t) { return net->b0(t); }, x);
  const auto message = refusal_of([&] { torch::autograd::grad({y.sum()}, {x}); });
  EXPECT_NE(message.find("torch::autograd::grad() and backward(inputs=...) are not supported"), std::string::npos);
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_FALSE(x.grad().defined());
}

TEST(Consumer, CheckpointRefusesBackwardWithInputs) {
  torch::manual_seed(0);
  Net net(false);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto y = ckcheck::checkpoint([&](const torch::Tensor& t) { return net->b0(t); }, x);
  const auto message = refusal_of([&] { y.sum().backward({}, false, false, {x}); });
  EXPECT_NE(message.find("backward(inputs=...) are not supported"), std::string::npos) << message;
  for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Consumer, CheckpointRefusesDoubleBackward) {
  torch::manual_seed(0);
  Net net(false);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto y = ckcheck::checkpoint([&](const torch::Tensor& t) { return net->b0(t); }, x);
  const auto message = refusal_of([&] { y.sum().backward({}, true, /*create_graph=*/true); });
  EXPECT_NE(message.find("double backward (create_graph=true) is not supported"), std::string::npos) << message;
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
