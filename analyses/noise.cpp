#include "analyses/noise.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>

namespace ckcheck {

const NoiseEnvelope::Entry* NoiseEnvelope::find(const std::string& name, const std::string& kind, int64_t step) const {
  for (const auto& e : entries) {
    if (e.name == name && e.kind == kind && e.step == step) return &e;
  }
  return nullptr;
}

namespace {

double largest_difference(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined() || !a.is_floating_point() || a.sizes() != b.sizes() || a.numel() == 0) return 0.0;
  if (torch::equal(a, b)) return 0.0;
  const auto d = (a.to(torch::kDouble) - b.to(torch::kDouble)).abs();
  return torch::where(torch::isfinite(d), d, torch::zeros_like(d)).max().item<double>();
}

// Raises each entry to the largest difference `rerun` shows from the reference.
void widen(NoiseEnvelope& noise, const StepRecord& reference, const StepRecord& rerun) {
  for (size_t i = 0; i < reference.tensors.size(); ++i) {
    const auto& t = reference.tensors[i];
    const auto* other = rerun.find(t.name, t.kind, t.step);
    if (!other) continue;
    noise.entries[i].max_abs = std::max(noise.entries[i].max_abs, largest_difference(t.value, other->value));
  }
}

}  // namespace

NoiseEnvelope measure_noise(Runner& runner, const StepRecord& reference, const StepRecord& first, int reruns) {
  torch::NoGradGuard no_grad;
  NoiseEnvelope noise;
  for (const auto& t : reference.tensors) {
    const double scale = t.value.defined() && t.value.is_floating_point() && t.value.numel() > 0
                             ? t.value.abs().max().item<double>()
                             : 0.0;
    noise.entries.push_back({t.name, t.kind, t.step, 0.0, scale});
  }
  const int threads = torch::get_num_threads();
  noise.reruns = 1;
  noise.threads.push_back(threads);
  widen(noise, reference, first);
  StepOptions plain;
  plain.evidence = false;
  for (int k = 0; k < reruns; ++k) {
    // The last rerun regroups the CPU's parallel sums: another intra-op thread count.
    const int n = k + 1 == reruns ? (threads > 1 ? 1 : 2) : threads;
    torch::set_num_threads(n);
    StepRecord again;
    try {
      again = runner.run(nullptr, plain, "reference, rerun");
    } catch (...) {
      torch::set_num_threads(threads);
      throw;
    }
    torch::set_num_threads(threads);
    if (!again.error.empty()) continue;  // a rerun that failed measures nothing
    ++noise.reruns;
    noise.threads.push_back(n);
    widen(noise, reference, again);
  }
  return noise;
}

namespace {

// The largest noise of a step's tensors relative to their own scale, per step.
std::map<int64_t, double> relative_noise_by_step(const NoiseEnvelope& noise) {
  std::map<int64_t, double> out;
  for (const auto& e : noise.entries) {
    if (e.max_abs > 0.0 && e.scale > 0.0) out[e.step] = std::max(out[e.step], e.max_abs / e.scale);
  }
  return out;
}

}  // namespace

void within_noise(std::vector<TensorDiff>& diffs, NoiseEnvelope& noise) {
  const auto step_noise = relative_noise_by_step(noise);
  for (auto& d : diffs) {
    if (d.equal || d.missing != "none" || !d.note.empty() || d.nonfinite_checkpointed != d.nonfinite_reference) continue;
    const auto* e = noise.find(d.name, d.kind, d.step);
    if (!e) continue;
    // A few reruns sample a tensor's noise, and can miss it: a tensor computed from noisy ones may
    // round alike in every rerun (a scalar loss often does), or vary less there than in the next
    // step. In a step whose tensors vary, each is allowed at least the step's largest relative
    // noise at its own scale; in a step where nothing varies, nothing is.
    const auto rel = step_noise.find(d.step);
    const double envelope = std::max(e->max_abs, rel == step_noise.end() ? 0.0 : rel->second * e->scale);
    if (envelope <= 0.0 || !(d.max_abs <= NoiseEnvelope::kFactor * envelope)) continue;
    d.equal = true;
    d.mismatched = 0;
    d.first_index = -1;
    noise.within.push_back(d.name);
  }
}

std::vector<std::string> noise_beyond_rounding(const NoiseEnvelope& noise, const StepRecord& reference) {
  std::vector<std::string> out;
  for (size_t i = 0; i < noise.entries.size() && i < reference.tensors.size(); ++i) {
    const auto& e = noise.entries[i];
    const auto& t = reference.tensors[i];
    if (e.max_abs <= 0.0 || !t.value.defined()) continue;
    // The loss is kept in double, computed in the outputs' precision: float32's epsilon at the least.
    const double eps = std::max(machine_epsilon(t.value.scalar_type()), t.kind == "loss" ? machine_epsilon(torch::kFloat) : 0.0);
    if (e.max_abs > kAutoEpsilons * eps * e.scale) out.push_back(e.name);
  }
  return out;
}

}  // namespace ckcheck
