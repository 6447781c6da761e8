// torch.ops.ckcheck_memory for Python: the same CPU memory measurement as `ckcheck bench`, so
// compare_pytorch.py can put torch.utils.checkpoint and ckcheck::checkpoint side by side.
#include <torch/library.h>

#include "harness/memory.h"

namespace {

int64_t peak_bytes() { return ckcheck::MemoryMeter::of(torch::kCPU).peak_bytes(); }
int64_t current_bytes() { return ckcheck::MemoryMeter::of(torch::kCPU).current_bytes(); }
void reset_peak() { ckcheck::MemoryMeter::of(torch::kCPU).reset_peak(); }

}  // namespace

TORCH_LIBRARY(ckcheck_memory, m) {
  // Loading the library installs the tracking allocator.
  ckcheck::install_cpu_tracking_allocator();
  m.def("peak_bytes", &peak_bytes);
  m.def("current_bytes", &current_bytes);
  m.def("reset_peak", &reset_peak);
}
