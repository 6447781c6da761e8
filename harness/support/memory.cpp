#include "harness/support/memory.h"

#include <c10/core/CPUAllocator.h>

#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

#include "harness/support/compat.h"

namespace ckcheck {

#ifdef CKCHECK_WITH_CUDA
// In cuda_memory.cpp, compiled only in a CUDA build.
MemoryMeter& cuda_meter(int device);
double time_on_cuda(int device, const std::function<void()>& fn);
void release_cuda_cache();
#endif

namespace {

// Counts every byte allocated through LibTorch's CPU allocator. Each block carries a header with
// its size in front of the data, so that the data pointer is its own context: some LibTorch code
// allocates through raw_allocate(), which requires exactly that.
class TrackingAllocator : public compat::AllocatorShim {
 public:
  explicit TrackingAllocator(c10::Allocator* base) : base_(base) {
    TORCH_CHECK(base_->raw_deleter() != nullptr,
                "ckcheck: LibTorch's CPU allocator does not support raw allocation, so its memory "
                "cannot be tracked");
  }

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

 protected:
  c10::DataPtr allocate_bytes(size_t n) const override {
    // 64 bytes keep the data at LibTorch's CPU alignment.
    auto* block = static_cast<char*>(base_->raw_allocate(n + kHeader));
    *reinterpret_cast<int64_t*>(block) = static_cast<int64_t>(n);
    const int64_t now = current_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
    void* data = block + kHeader;
    return {data, data, &release, c10::Device(c10::kCPU)};
  }

 private:
  static constexpr size_t kHeader = 64;

  static void release(void* data) {
    auto* block = static_cast<char*>(data) - kHeader;
    the()->current_.fetch_sub(*reinterpret_cast<int64_t*>(block));
    the()->base_->raw_deallocate(block);
  }

  static TrackingAllocator* the();

  c10::Allocator* base_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
};

TrackingAllocator* tracker() {
  static TrackingAllocator* t = [] {
    // Never destroyed: tensors alive at exit still free through it.
    auto* a = new TrackingAllocator(c10::GetCPUAllocator());
    // Priority above the default (0) so LibTorch keeps it.
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  return t;
}

TrackingAllocator* TrackingAllocator::the() { return tracker(); }

class CpuMeter : public MemoryMeter {
 public:
  int64_t current_bytes() override { return tracker()->current(); }
  int64_t peak_bytes() override { return tracker()->peak(); }
  void reset_peak() override { tracker()->reset_peak(); }
};

}  // namespace

void install_cpu_tracking_allocator() { tracker(); }

MemoryMeter& MemoryMeter::of(const torch::Device& device) {
#ifdef CKCHECK_WITH_CUDA
  if (device.is_cuda()) return cuda_meter(device.has_index() ? device.index() : 0);
#endif
  TORCH_CHECK(device.is_cpu(), "ckcheck measures memory on the CPU", 
#ifdef CKCHECK_WITH_CUDA
              " and on CUDA devices",
#else
              " only in this build (no CUDA)",
#endif
              "; got ", device);
  static CpuMeter cpu;
  tracker();
  return cpu;
}

double time_on_device(const torch::Device& device, const std::function<void()>& fn) {
#ifdef CKCHECK_WITH_CUDA
  if (device.is_cuda()) return time_on_cuda(device.has_index() ? device.index() : 0, fn);
#endif
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

InstructionCounter::InstructionCounter() {
  perf_event_attr attr{};
  attr.type = PERF_TYPE_HARDWARE;
  attr.size = sizeof(attr);
  attr.config = PERF_COUNT_HW_INSTRUCTIONS;
  attr.exclude_kernel = 1;
  attr.exclude_hv = 1;
  // Threads LibTorch starts later (its intra-op pool) are counted too.
  attr.inherit = 1;
  const long fd = syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0);
  if (fd < 0) {
    why_not_ = std::string("perf_event_open: ") + std::strerror(errno) +
               (errno == EACCES || errno == EPERM ? " (kernel.perf_event_paranoid forbids it)"
                                                  : " (no hardware counters here, e.g. in a VM)");
    return;
  }
  fd_ = static_cast<int>(fd);
}

InstructionCounter::~InstructionCounter() {
  if (fd_ >= 0) close(fd_);
}

std::optional<int64_t> InstructionCounter::read() const {
  if (fd_ < 0) return std::nullopt;
  int64_t count = 0;
  if (::read(fd_, &count, sizeof(count)) != static_cast<ssize_t>(sizeof(count))) return std::nullopt;
  return count;
}

const InstructionCounter& instruction_counter() {
  static const InstructionCounter counter;
  return counter;
}

void release_cached_memory(const torch::Device& device) {
#ifdef CKCHECK_WITH_CUDA
  if (device.is_cuda()) release_cuda_cache();
#endif
}

}  // namespace ckcheck
