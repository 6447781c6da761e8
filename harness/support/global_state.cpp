#include "harness/support/global_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/record_function.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <cstring>
#include <type_traits>

#include "harness/support/compat.h"

namespace ckcheck {

int cuda_device_count() {
  static const int count = static_cast<int>(torch::cuda::device_count());
  return count;
}

namespace {
at::Generator cuda_generator(int device) {
  return at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, device));
}
}  // namespace

RngState RngState::capture() {
  RngState s;
  s.cpu = compat::generator_state(at::detail::getDefaultCPUGenerator());
  for (int d = 0; d < cuda_device_count(); ++d) {
    if (compat::cuda_device_initialised(d)) s.cuda.emplace_back(d, compat::generator_state(cuda_generator(d)));
  }
  return s;
}

void RngState::restore() const {
  compat::set_generator_state(at::detail::getDefaultCPUGenerator(), cpu);
  for (const auto& [d, state] : cuda) compat::set_generator_state(cuda_generator(d), state);
}

bool RngState::operator==(const RngState& other) const {
  auto same = [](const torch::Tensor& a, const torch::Tensor& b) {
    return a.defined() == b.defined() && (!a.defined() || torch::equal(a, b));
  };
  if (!same(cpu, other.cpu) || cuda.size() != other.cuda.size()) return false;
  for (size_t i = 0; i < cuda.size(); ++i) {
    if (cuda[i].first != other.cuda[i].first || !same(cuda[i].second, other.cuda[i].second)) return false;
  }
  return true;
}

namespace {
struct SpareEngines {
  static constexpr size_t kKept = 8;
  std::vector<std::unique_ptr<at::mt19937>> engines;
  ~SpareEngines() { gone = true; }
  static thread_local bool gone;  // trivially destructible: still readable once `engines` is destroyed
};
thread_local bool SpareEngines::gone = false;
thread_local SpareEngines spare_engines;
}  // namespace

void RngFork::Recycle::operator()(at::mt19937* engine) const {
  if (!SpareEngines::gone && spare_engines.engines.size() < SpareEngines::kKept) {
    spare_engines.engines.emplace_back(engine);
  } else {
    delete engine;
  }
}

RngFork RngFork::capture() {
  RngFork f;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* cpu = at::check_generator<at::CPUGeneratorImpl>(gen);
    if (SpareEngines::gone || spare_engines.engines.empty()) {
      f.cpu_engine_.reset(new at::mt19937(cpu->engine()));
    } else {
      // Built in place from the copy engine() returns: one copy of the 2.5 KB, not two.
      auto* engine = spare_engines.engines.back().release();
      spare_engines.engines.pop_back();
      f.cpu_engine_.reset(new (engine) at::mt19937(cpu->engine()));
    }
    f.cpu_next_float_ = cpu->next_float_normal_sample();
    f.cpu_next_double_ = cpu->next_double_normal_sample();
  }
  for (int d = 0; d < cuda_device_count(); ++d) {
    if (!compat::cuda_device_initialised(d)) continue;
    at::DisableRecordFunctionGuard quiet;  // reading a CUDA state makes a tensor: no op of the caller's
    f.cuda_.emplace_back(d, compat::generator_state(cuda_generator(d)));
  }
  return f;
}

void RngFork::restore() const {
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* cpu = at::check_generator<at::CPUGeneratorImpl>(gen);
    cpu->set_engine(*cpu_engine_);
    cpu->set_next_float_normal_sample(cpu_next_float_);
    cpu->set_next_double_normal_sample(cpu_next_double_);
  }
  restore_cuda();
}

void RngFork::restore_over(const RngFork& now) const {
  if (!same_cpu_state(now)) {
    restore();
    return;
  }
  restore_cuda();
}

bool RngFork::same_cpu_state(const RngFork& other) const {
  // Byte for byte, in place (the engine's data() accessor would copy it): equal bytes are an equal
  // state; padding that differs only costs a restore that was not needed.
  static_assert(std::is_trivially_copyable_v<at::mt19937>);
  return std::memcmp(cpu_engine_.get(), other.cpu_engine_.get(), sizeof(at::mt19937)) == 0 &&
         cpu_next_float_ == other.cpu_next_float_ && cpu_next_double_ == other.cpu_next_double_;
}

void RngFork::restore_cuda() const {
  if (cuda_.empty()) return;
  at::DisableRecordFunctionGuard quiet;
  for (const auto& [d, state] : cuda_) compat::set_generator_state(cuda_generator(d), state);
}

void seed_all(uint64_t seed) {
  torch::manual_seed(seed);  // seeds CUDA generators too when CUDA is present
}

AutocastState AutocastState::capture() {
  AutocastState s;
  s.cpu_enabled = compat::autocast_enabled(c10::kCPU);
  s.cuda_enabled = compat::autocast_enabled(c10::kCUDA);
  s.cpu_dtype = compat::autocast_dtype(c10::kCPU);
  s.cuda_dtype = compat::autocast_dtype(c10::kCUDA);
  s.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return s;
}

bool AutocastState::operator==(const AutocastState& o) const {
  return cpu_enabled == o.cpu_enabled && cuda_enabled == o.cuda_enabled &&
         cpu_dtype == o.cpu_dtype && cuda_dtype == o.cuda_dtype &&
         cache_enabled == o.cache_enabled;
}

namespace {
void apply(const AutocastState& s) {
  compat::set_autocast_enabled(c10::kCPU, s.cpu_enabled);
  compat::set_autocast_enabled(c10::kCUDA, s.cuda_enabled);
  compat::set_autocast_dtype(c10::kCPU, s.cpu_dtype);
  compat::set_autocast_dtype(c10::kCUDA, s.cuda_dtype);
  at::autocast::set_autocast_cache_enabled(s.cache_enabled);
}
}  // namespace

AutocastScope::AutocastScope(const AutocastState& state) : previous_(AutocastState::capture()) {
  apply(state);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  // As torch.autocast's __exit__: the cast cache lives until the outermost region ends.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  apply(previous_);
}

}  // namespace ckcheck
