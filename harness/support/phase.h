// Where a run is -- loading the model, the plain step, the checkpointed step, a probe, the
// reports -- for what a timeout or a crash names, and the status line a supervising ckcheck reads.
//
// A Python model runs in a child process that the ckcheck program supervises; the child tells it
// through a pipe (the status channel) when ckcheck has started, each phase, and the exit status
// it chose, so that a model that kills or exits the process is told apart from ckcheck's own exit.
#pragma once

#include <string>

namespace ckcheck {

/// Sets the phase (a string literal or other static text) and tells the status channel.
void set_phase(const char* phase);
/// The phase now ("starting" before any).
const char* current_phase();

/// The status channel: a file descriptor a supervising ckcheck reads (lines "started",
/// "phase NAME", "exit N"); -1 (the default) for none.
void set_status_fd(int fd);
/// True when a supervising ckcheck watches this process (and keeps its --timeout).
bool supervised();
/// Says on the status channel that ckcheck itself ends the process with `code`.
void tell_exit(int code);
/// Says on the status channel that ckcheck has started in this process.
void tell_started();

}  // namespace ckcheck
