// The one place where ckcheck adapts to LibTorch's API. ckcheck is built and tested against pip
// torch's LibTorch 2.13 and 2.14, and needs at least 2.4 (the device-typed autocast calls, the
// non-const c10::Allocator); older releases are refused here rather than half-supported.
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Allocator.h>
#include <torch/version.h>

#include <cstring>
#include <mutex>

static_assert(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4),
              "ckcheck needs LibTorch 2.4 or newer (pip torch); see the README");

namespace ckcheck {
namespace compat {

// Autocast state, per device type (the device-typed calls of LibTorch 2.4 and newer).
inline bool autocast_enabled(c10::DeviceType device) { return at::autocast::is_autocast_enabled(device); }
inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
  at::autocast::set_autocast_enabled(device, enabled);
}
inline c10::ScalarType autocast_dtype(c10::DeviceType device) { return at::autocast::get_autocast_dtype(device); }
inline void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(device, dtype);
}

// Generator state, under the generator's mutex as at::Generator's users must; the CUDA default
// generators are reached through the device-generic Context call, which also compiles (and is never
// reached) in a CPU-only build.
inline at::Tensor generator_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

inline void set_generator_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Whether a CUDA device has been initialised (its primary context exists): RNG states are saved
// for those only, since touching another device would initialise it at a cost of hundreds of MB.
inline bool cuda_device_initialised(int device) {
  return at::detail::getCUDAHooks().hasPrimaryContext(static_cast<c10::DeviceIndex>(device));
}

// c10::Allocator: allocate() is non-const and copy_data() pure virtual. A subclass implements
// allocate_bytes().
class AllocatorShim : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override { return allocate_bytes(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 protected:
  virtual c10::DataPtr allocate_bytes(size_t n) const = 0;
};

}  // namespace compat
}  // namespace ckcheck
