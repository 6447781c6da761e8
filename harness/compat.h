// The one place where LibTorch 1.13 (Debian's, the default build) and LibTorch 2.x (the official
// CUDA builds and pip torch) differ for ckcheck. Everything else in the tree is version-neutral.
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Allocator.h>
#include <torch/version.h>

#define CKCHECK_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||          \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace ckcheck {
namespace compat {

// Autocast state. 2.4 replaced the CPU/GPU-named calls (is_cpu_enabled, get_autocast_gpu_dtype, ...)
// with device-typed ones (is_autocast_enabled(kCPU), get_autocast_dtype(kCUDA), ...).
inline bool autocast_enabled(c10::DeviceType device) {
#if CKCHECK_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
#if CKCHECK_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::kCPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if CKCHECK_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::kCPU ? at::autocast::get_autocast_cpu_dtype()
                             : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
#if CKCHECK_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::kCPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

// Generator state: get_state/set_state on at::Generator under its mutex in both versions; the CUDA
// default generators are reached through the device-generic Context call, which also compiles (and
// is never reached) in a CPU-only build.
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

// c10::Allocator: 2.3 made allocate() non-const and added a pure virtual copy_data(). A subclass
// derives from this shim and implements allocate_bytes(); both allocate() overloads are declared so
// that whichever one the base class declares virtual is the one overridden.
class AllocatorShim : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const { return allocate_bytes(n); }  // NOLINT: 1.13 signature
  c10::DataPtr allocate(size_t n) { return allocate_bytes(n); }        // NOLINT: 2.3+ signature
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }

 protected:
  virtual c10::DataPtr allocate_bytes(size_t n) const = 0;
};

}  // namespace compat
}  // namespace ckcheck
