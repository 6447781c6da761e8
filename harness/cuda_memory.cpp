// The CUDA side of memory.h: the caching allocator's statistics and CUDA-event timing. Compiled
// only when Torch was built with CUDA.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "harness/memory.h"

namespace ckcheck {
namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

class CudaMeter : public MemoryMeter {
 public:
  explicit CudaMeter(int device) : device_(device) {}
  int64_t current_bytes() override { return stat().current; }
  int64_t peak_bytes() override { return stat().peak; }
  void reset_peak() override { alloc::resetPeakStats(device_); }

 private:
  alloc::Stat stat() {
    return alloc::getDeviceStats(device_).allocated_bytes[static_cast<size_t>(alloc::StatType::AGGREGATE)];
  }
  int device_;
};

}  // namespace

MemoryMeter& cuda_meter(int device) {
  static std::vector<std::unique_ptr<CudaMeter>> meters;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (meters.size() <= static_cast<size_t>(device)) meters.resize(device + 1);
  if (!meters[device]) meters[device] = std::make_unique<CudaMeter>(device);
  return *meters[device];
}

double time_on_cuda(int device, const std::function<void()>& fn) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  auto stream = c10::cuda::getCurrentCUDAStream();
  start.record(stream);
  fn();
  stop.record(stream);
  stop.synchronize();
  return start.elapsed_time(stop) / 1000.0;
}

void release_cuda_cache() { alloc::emptyCache(); }

}  // namespace ckcheck
