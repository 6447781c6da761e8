// Measuring memory and time on a device. LibTorch's CPU allocator keeps no statistics, so ckcheck
// installs a tracking allocator in front of it; on CUDA the caching allocator's own peak counts.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>

namespace ckcheck {

class MemoryMeter {
 public:
  virtual ~MemoryMeter() = default;
  /// Bytes allocated now.
  virtual int64_t current_bytes() = 0;
  /// Most bytes allocated at once since the last reset_peak().
  virtual int64_t peak_bytes() = 0;
  /// Starts a new peak from what is allocated now.
  virtual void reset_peak() = 0;

  /// The meter of a device. The CPU one installs the tracking allocator on first use: tensors
  /// allocated before that are not counted.
  static MemoryMeter& of(const torch::Device& device);
};

/// Puts the tracking allocator in front of LibTorch's CPU allocator (idempotent).
void install_cpu_tracking_allocator();

/// Seconds `fn` takes on the device: CUDA events on a GPU, a steady clock on the CPU.
double time_on_device(const torch::Device& device, const std::function<void()>& fn);

/// Hands cached blocks back after an out-of-memory error (CUDA), so the next measurement starts
/// clean.
void release_cached_memory(const torch::Device& device);

}  // namespace ckcheck
