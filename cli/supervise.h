// What keeps a run within its bounds and its output its own: the --timeout of a single-process
// run, standard output kept for the report sent there, reports written all together or not at
// all, and the child process a Python model runs in, watched from the ckcheck program.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "reports/report.h"

namespace ckcheck::cli {

/// Stops the process with one line and exit status 2 if it is still running `seconds` from now,
/// naming the phase it was in (set_phase); no report is written after that. Past the start of
/// commit_reports it never fires: the reports are written whole.
void arm_deadline(int seconds);

/// While a report goes to standard output, what the model prints goes to standard error: called
/// once the targets are known; commit_reports gives standard output back to the report.
void hold_stdout_for_report();

/// Called before the reports are written (the Python extension flushes Python's own buffers).
void set_before_report(std::function<void()> hook);

/// Writes the reports (write_reports) unless the deadline has fired: from here on it cannot.
void commit_reports(const Report& report, const std::vector<ReportTarget>& targets);

/// Runs `ckcheck ARGS` in `python` (the Python model's own interpreter) as a child process and
/// watches it: its exit status when ckcheck ends it; one line and status 2 when the interpreter
/// cannot start ckcheck, when the model exits the process itself or a signal kills it (naming the
/// phase), or when it outlives --timeout; SIGINT, SIGTERM and SIGHUP stop it within a second
/// (status 128 + the signal). The child and anything it started die with this process.
int run_python_child(const std::string& python, const std::vector<std::string>& args);

}  // namespace ckcheck::cli
