// torch.ops.ckcheck_memory and torch.ops.ckcheck_bench for Python: the same CPU memory
// measurement as `ckcheck bench`, and ckcheck's own training step of the built-in transformer, so
// compare_pytorch.py can run ckcheck::checkpoint and torch.utils.checkpoint step by step,
// interleaved, in one process on one LibTorch.
#include <torch/library.h>

#include <memory>
#include <vector>

#include "fixtures/registry.h"
#include "harness/runner/plan.h"
#include "harness/runner/runner.h"
#include "harness/support/memory.h"

namespace {

int64_t peak_bytes() { return ckcheck::MemoryMeter::of(torch::kCPU).peak_bytes(); }
int64_t current_bytes() { return ckcheck::MemoryMeter::of(torch::kCPU).current_bytes(); }
void reset_peak() { ckcheck::MemoryMeter::of(torch::kCPU).reset_peak(); }

// One built-in model with its Runner, alive across calls so that each step costs only the step.
struct Session {
  std::unique_ptr<ckcheck::Model> model;
  std::unique_ptr<ckcheck::Runner> runner;
};
std::vector<std::unique_ptr<Session>>& sessions() {
  static std::vector<std::unique_ptr<Session>> all;
  return all;
}

// Builds the transformer fixture; the options are those of `ckcheck bench --model transformer`.
int64_t make_transformer(int64_t layers, int64_t hidden, int64_t heads, int64_t seq, int64_t batch,
                         int64_t vocab, double dropout, int64_t seed) {
  auto s = std::make_unique<Session>();
  s->model = ckcheck::make_model("transformer",
                                 {{"layers", std::to_string(layers)}, {"hidden", std::to_string(hidden)},
                                  {"heads", std::to_string(heads)}, {"seq", std::to_string(seq)},
                                  {"batch", std::to_string(batch)}, {"vocab", std::to_string(vocab)},
                                  {"dropout", std::to_string(dropout)}},
                                 static_cast<uint64_t>(seed));
  ckcheck::RunConfig config;
  config.seed = static_cast<uint64_t>(seed);
  s->runner = std::make_unique<ckcheck::Runner>(*s->model, config);
  sessions().push_back(std::move(s));
  return static_cast<int64_t>(sessions().size()) - 1;
}

// One training step (forward and backward) under `policy`: [seconds, peak bytes above the start].
std::vector<double> step(int64_t session, const std::string& policy) {
  TORCH_CHECK(session >= 0 && session < static_cast<int64_t>(sessions().size()), "no ckcheck_bench session ", session);
  auto& s = *sessions()[session];
  const auto plan = ckcheck::Plan::make(*s.model, {}, ckcheck::Policy::parse(policy));
  const auto m = s.runner->measure(&plan, 0, 1);
  TORCH_CHECK(m.error.empty(), "ckcheck step failed: ", m.error);
  return {m.step_seconds.at(0), static_cast<double>(m.peak_bytes)};
}

}  // namespace

TORCH_LIBRARY(ckcheck_memory, m) {
  // Loading the library installs the tracking allocator.
  ckcheck::install_cpu_tracking_allocator();
  m.def("peak_bytes", &peak_bytes);
  m.def("current_bytes", &current_bytes);
  m.def("reset_peak", &reset_peak);
}

TORCH_LIBRARY(ckcheck_bench, m) {
  m.def("make_transformer", &make_transformer);
  m.def("step", &step);
}
