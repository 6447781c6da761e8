// Measuring memory and time on a device. LibTorch's CPU allocator keeps no statistics, so ckcheck
// installs a tracking allocator in front of it; on CUDA the caching allocator's own peak counts.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

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

/// The process's CPU time so far (user + system, all threads): CLOCK_PROCESS_CPUTIME_ID. Other
/// processes on the machine do not advance it, unlike the wall clock.
double process_cpu_seconds();

/// Counts the instructions this process retires (all its threads), through perf_event_open where
/// the kernel permits it; far less sensitive to other processes than any clock.
class InstructionCounter {
 public:
  InstructionCounter();
  ~InstructionCounter();
  InstructionCounter(const InstructionCounter&) = delete;
  InstructionCounter& operator=(const InstructionCounter&) = delete;
  /// Instructions retired so far, or nothing when counting is unavailable.
  std::optional<int64_t> read() const;
  bool available() const { return fd_ >= 0; }
  /// Why counting is unavailable ("" when it is available).
  const std::string& why_not() const { return why_not_; }

 private:
  int fd_ = -1;
  std::string why_not_;
};

/// The process-wide counter, opened on first use.
const InstructionCounter& instruction_counter();

/// Hands cached blocks back after an out-of-memory error (CUDA), so the next measurement starts
/// clean.
void release_cached_memory(const torch::Device& device);

}  // namespace ckcheck
