// TorchScript models: scripted modules built and saved here in C++ (so CI needs no Python), then
// checked end to end through the CLI.
#include "harness/model/torchscript_model.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/script.h>
#include <torch/serialize.h>

#include <fstream>

#include "cli/app.h"
#include "harness/runner/plan.h"
#include "harness/support/errors.h"
#include "tests/support/support.h"

namespace ckcheck {
namespace {

// Modules made in C++ lack the `training` attribute nn.Module gives scripted Python modules, and
// call their submodules as self.sub.forward(x) (C++ define() has no module __call__).
torch::jit::Module make_module(const std::string& name) {
  torch::jit::Module m(name);
  m.register_attribute("training", c10::BoolType::get(), true);
  return m;
}

using torch::jit::Module;

// A residual block: x + tanh(x W^T + b), with optional dropout and a call counter buffer.
Module block(int64_t width, double dropout, bool counts_calls, int seed) {
  torch::manual_seed(seed);
  Module m = make_module("Block");
  m.register_parameter("weight", (torch::randn({width, width}) * 0.3).requires_grad_(), false);
  m.register_parameter("bias", (torch::randn({width}) * 0.1).requires_grad_(), false);
  m.register_attribute("p", c10::FloatType::get(), dropout);
  m.register_buffer("calls", torch::zeros({1}));
  std::string body = R"(
def forward(self, x):
    h = torch.tanh(torch.addmm(self.bias, x, self.weight.t()))
    h = torch.dropout(h, self.p, self.training)
)";
  if (counts_calls) body += "    self.calls.add_(1)\n";
  body += "    return x + h\n";
  m.define(body);
  return m;
}

// A block whose forward takes an int besides its tensor (passed through to every call) and
// returns a string beside its tensor (which no checkpoint can return).
Module scaled_block(int64_t width) {
  Module m = make_module("Scaled");
  m.register_parameter("weight", (torch::randn({width, width}) * 0.3).requires_grad_(), false);
  m.define(R"(
def forward(self, x, k: int):
    return x + k * torch.mm(x, self.weight), "scaled"
)");
  return m;
}

std::string save_net(const std::string& name, double dropout, bool counts_calls, bool with_scaled = false) {
  Module net = make_module("Net");
  Module outer = make_module("Outer");
  outer.register_module("inner", block(8, dropout, false, 3));
  outer.define(R"(
def forward(self, x):
    return self.inner.forward(x) * 0.5
)");
  net.register_module("layer1", block(8, dropout, counts_calls, 1));
  net.register_module("layer2", block(8, dropout, false, 2));
  net.register_module("layer3", outer);
  if (with_scaled) net.register_module("scaled", scaled_block(8));
  net.define(with_scaled ? R"(
def forward(self, x):
    x = self.layer1.forward(x)
    x = self.layer2.forward(x)
    x, tag = self.scaled.forward(x, 2)
    return self.layer3.forward(x)
)"
                         : R"(
def forward(self, x):
    x = self.layer1.forward(x)
    x = self.layer2.forward(x)
    return self.layer3.forward(x)
)");
  const auto path = testing::scratch_path(name);
  net.save(path);
  return path;
}

nlohmann::json run_json(std::vector<std::string> args, int& code) {
  const auto path = testing::scratch_path("json");
  std::remove(path.c_str());
  args.push_back("--report");
  args.push_back("json=" + path);
  code = cli::run_cli(args);
  std::ifstream in(path);
  return in ? nlohmann::json::parse(in) : nlohmann::json();
}

std::string status_of(const nlohmann::json& j, const std::string& id) {
  for (const auto& c : j.at("checks")) {
    if (c.at("id") == id) return c.at("status");
  }
  return "";
}

// --input-shape/--input-dtype/--input-range are parsed once into typed values (TorchScript and
// Python models make their input from the same parse); a bad text names its field.
TEST(RandomInput, ParsesOnceIntoTypedValuesAndMakesTheSeedsTensor) {
  const auto r = RandomInput::parse("2x3", "int64", "0,10");
  EXPECT_EQ(r.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r.dtype, torch::kLong);
  EXPECT_EQ(r.shape_text() + " " + r.dtype_text() + " " + r.range_text(), "2,3 int64 0,10");
  const auto a = r.make(1);
  EXPECT_TRUE(torch::equal(a, r.make(1)));
  EXPECT_FALSE(torch::equal(a, r.make(2)));
  EXPECT_GE(a.min().item<int64_t>(), 0);
  EXPECT_LT(a.max().item<int64_t>(), 10);
  EXPECT_FALSE(RandomInput::parse("", "float32", "").given());
  auto field_of = [](const std::string& shape, const std::string& dtype, const std::string& range) -> std::string {
    try {
      RandomInput::parse(shape, dtype, range);
    } catch (const FieldError& e) {
      return e.field();
    }
    return "";
  };
  EXPECT_EQ(field_of("2,0", "float32", ""), "input_shape");
  EXPECT_EQ(field_of("2,a", "float32", ""), "input_shape");
  EXPECT_EQ(field_of("2", "float8", ""), "input_dtype");
  EXPECT_EQ(field_of("2", "int64", ""), "input_range");  // token ids need a range
  EXPECT_EQ(field_of("2", "float32", "5,1"), "input_range");
  EXPECT_EQ(field_of("2", "float32", "0,1"), "");
}

TEST(TorchScript, SitesAreTheSubmoduleCalls) {
  const auto path = save_net("sites.pt", 0.0, false);
  TorchScriptInputs in;
  in.random = RandomInput::parse("4,8", "float32", "");
  auto model = load_torchscript_model(path, in, 0);
  EXPECT_EQ(model->sites(), (std::vector<std::string>{"layer1", "layer2", "layer3", "layer3.inner"}));
  EXPECT_EQ(model->default_sites(), (std::vector<std::string>{"layer1", "layer2", "layer3"}));
  // Outer matches win over nested ones.
  auto plan = Plan::make(*model, {"layer3*"}, Policy::parse("every:1"));
  EXPECT_EQ(plan.checkpointed(), std::vector<std::string>{"layer3"});
}

TEST(TorchScript, CleanModelPassesBitwise) {
  const auto path = save_net("clean.pt", 0.0, false);
  int code = -1;
  const auto j = run_json({"run", "--model", path, "--input-shape", "4,8", "--sites", "layer*"}, code);
  EXPECT_EQ(code, 0) << j.dump(2);
  EXPECT_EQ(j.at("verdict"), "pass");
  EXPECT_EQ(j.at("model").at("checkpointed"), nlohmann::json({"layer1", "layer2", "layer3"}));
  EXPECT_EQ(status_of(j, "gradients"), "pass");
}

TEST(TorchScript, DropoutWithoutRngReplayFailsRng) {
  const auto path = save_net("dropout.pt", 0.3, false);
  int code = -1;
  auto ok = run_json({"run", "--model", path, "--input-shape", "4,8"}, code);
  EXPECT_EQ(code, 0) << ok.dump(2);
  auto bad = run_json({"run", "--model", path, "--input-shape", "4,8", "--no-preserve-rng"}, code);
  EXPECT_EQ(code, 1);
  EXPECT_EQ(status_of(bad, "rng"), "fail");
}

TEST(TorchScript, StatefulBufferIsFound) {
  const auto path = save_net("counter.pt", 0.0, true);
  int code = -1;
  auto j = run_json({"run", "--model", path, "--input-shape", "4,8"}, code);
  EXPECT_EQ(code, 1);
  EXPECT_EQ(status_of(j, "buffers"), "fail");
}

TEST(TorchScript, InputsFromAFileSavedWithPickle) {
  const auto path = save_net("fromfile.pt", 0.0, false);
  const auto inputs = testing::scratch_path("inputs.pt");
  const auto bytes = torch::pickle_save(c10::IValue(torch::randn({3, 8})));
  std::ofstream(inputs, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  int code = -1;
  auto j = run_json({"run", "--model", path, "--input", inputs}, code);
  EXPECT_EQ(code, 0) << j.dump(2);
}

TEST(TorchScript, BadInputsAreOneLineUsageErrors) {
  const auto path = save_net("bad.pt", 0.0, false, /*with_scaled=*/true);
  const auto err = [](std::vector<std::string> args) {
    ::testing::internal::CaptureStderr();
    const int code = cli::run_cli(args);
    const auto text = ::testing::internal::GetCapturedStderr();
    return std::make_pair(code, text);
  };
  auto [c1, e1] = err({"run", "--model", path, "--input-shape", "4,8", "--sites", "scaled"});
  EXPECT_EQ(c1, 2);
  EXPECT_NE(e1.find("bad.pt cannot be checkpointed: its forward returns Tuple[Tensor, str]"), std::string::npos) << e1;
  // A default candidate that cannot be checkpointed is named, never left out silently.
  auto [c0, e0] = err({"run", "--model", path, "--input-shape", "4,8"});
  EXPECT_EQ(c0, 2);
  EXPECT_NE(e0.find("site scaled of model"), std::string::npos) << e0;
  auto [c2, e2] = err({"run", "--model", path, "--input-shape", "4,3", "--sites", "layer*"});
  EXPECT_EQ(c2, 2);
  EXPECT_NE(e2.find("rejects its input"), std::string::npos) << e2;
  auto [c3, e3] = err({"run", "--model", path});
  EXPECT_EQ(c3, 2);
  EXPECT_NE(e3.find("--input-shape"), std::string::npos) << e3;
  auto [c4, e4] = err({"run", "--model", path, "--input-shape", "4,8", "--sites", "nothing*"});
  EXPECT_EQ(c4, 2);
  EXPECT_NE(e4.find("its sites are: layer1, layer2"), std::string::npos) << e4;
  auto [c5, e5] = err({"run", "--model", path, "--input-shape", "4,8", "--layers", "3"});
  EXPECT_EQ(c5, 2);
  EXPECT_NE(e5.find("--layers is an option of the built-in models"), std::string::npos) << e5;
  for (const auto& e : {e1, e2, e3, e4, e5}) {
    EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 1) << e;
  }
}

TEST(TorchScript, DiagnoseAndBenchWork) {
  const auto path = save_net("diag.pt", 0.3, false);
  int code = -1;
  auto d = run_json({"diagnose", "--model", path, "--input-shape", "4,8", "--no-preserve-rng"}, code);
  EXPECT_EQ(code, 1);
  ASSERT_TRUE(d.contains("diagnosis"));
  EXPECT_EQ(d.at("diagnosis").at("sites").at(0).at("cause"), "rng");
  EXPECT_EQ(d.at("diagnosis").at("first_divergent_op").at("site"), "layer1");
  auto b = run_json({"bench", "--model", path, "--input-shape", "4,8", "--policies", "none,every:1", "--steps", "1", "--warmup", "0"}, code);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(b.at("policies").size(), 2u);
}

}  // namespace
}  // namespace ckcheck
