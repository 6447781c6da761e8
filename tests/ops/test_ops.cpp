// Four custom ops for `ckcheck validate-op` to tell apart, registered the way users register
// theirs (TORCH_LIBRARY). Each is an implicit-autograd composite, so gradients flow through it.
#include <torch/library.h>
#include <torch/torch.h>

#include <atomic>

namespace {

using torch::Tensor;

// Safe: a pure function of its inputs.
Tensor clean(const Tensor& x, const Tensor& y) { return x * y + torch::sin(x); }

// Unsafe: scales by how often it was called, so a recompute computes something else.
std::atomic<int64_t> calls{0};
Tensor stateful(const Tensor& x) { return x * (1.0 + 0.1 * static_cast<double>(calls++)); }

// Unsafe: writes its input although its schema says `Tensor x`, not `Tensor(a!) x`.
Tensor mutating(Tensor x) {
  x.add_(1);
  return x * 2;
}

// Safe with the RNG replayed: draws from the default generator, which a checkpoint restores.
Tensor random_noise(const Tensor& x) { return x + torch::rand_like(x); }

}  // namespace

TORCH_LIBRARY(ckcheck_test, m) {
  m.def("clean(Tensor x, Tensor y) -> Tensor", &clean);
  m.def("stateful(Tensor x) -> Tensor", &stateful);
  m.def("mutating(Tensor x) -> Tensor", &mutating);
  m.def("random(Tensor x) -> Tensor", &random_noise);
}
