// The CUDA side of memory.h: the caching allocator's statistics and CUDA-event timing. Compiled
// only when Torch was built with CUDA.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <mutex>
#include <vector>

#include "harness/support/memory.h"

namespace ckcheck {
namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

class CudaMeter : public MemoryMeter {
 public:
  explicit CudaMeter(int device) : device_(device) {}
  int64_t current_bytes() override { return alloc::getDeviceStats(device_).allocated_bytes[kAggregate].current; }
  int64_t peak_bytes() override { return alloc::getDeviceStats(device_).allocated_bytes[kAggregate].peak; }
  void reset_peak() override { alloc::resetPeakStats(device_); }

 private:
  // The aggregate statistic is entry 0 of the stat array in every release; the StatType enum
  // naming it moved between namespaces (c10::cuda::CUDACachingAllocator in 1.13,
  // c10::CachingAllocator in 2.x), so the index is used rather than the name.
  static constexpr size_t kAggregate = 0;
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
