#include "harness/support/phase.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

namespace ckcheck {
namespace {

std::atomic<const char*> g_phase{"starting"};
std::atomic<int> g_status_fd{-1};

void tell(const std::string& line) {
  const int fd = g_status_fd.load();
  if (fd < 0) return;
  const std::string text = line + "\n";
  // One write per line: the reader never sees half of one. Errors (a supervisor gone) are ignored.
  [[maybe_unused]] const auto n = ::write(fd, text.data(), text.size());
}

}  // namespace

void set_phase(const char* phase) {
  g_phase.store(phase);
  tell(std::string("phase ") + phase);
}

const char* current_phase() { return g_phase.load(); }

void set_status_fd(int fd) { g_status_fd.store(fd); }

bool supervised() { return g_status_fd.load() >= 0; }

void tell_exit(int code) { tell("exit " + std::to_string(code)); }

void tell_started() { tell("started"); }

}  // namespace ckcheck
