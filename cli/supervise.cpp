#include "cli/supervise.h"

#include "cli/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>

#include "cli/common.h"
#include "harness/support/errors.h"
#include "harness/support/phase.h"

namespace ckcheck::cli {
namespace {

// The deadline of the run under way: armed for one run (a generation), disarmed when its reports
// begin; a deadline that fires first ends the process, and the reports then wait for that.
std::mutex g_deadline_mutex;
uint64_t g_generation = 0;  // the run under way; a deadline armed for an earlier one never fires

int& held_stdout() {
  static int fd = -1;
  return fd;
}

std::function<void()>& before_report() {
  static std::function<void()> hook;
  return hook;
}

}  // namespace

void arm_deadline(int seconds) {
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(g_deadline_mutex);
    generation = ++g_generation;
  }
  std::thread([seconds, generation] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::lock_guard<std::mutex> lock(g_deadline_mutex);
      if (g_generation != generation) return;  // its run reached its reports
    }
    std::unique_lock<std::mutex> lock(g_deadline_mutex);
    if (g_generation != generation) return;
    // The lock is held from here to the end of the process: no report begins.
    std::fprintf(stderr, "ckcheck: error: the run did not finish within --timeout %d s (it was in %s); stopped, no "
                         "report was written\n", seconds, current_phase());
    std::fflush(stderr);
    tell_exit(2);
    _exit(2);
  }).detach();
}

void hold_stdout_for_report() {
  if (held_stdout() >= 0) return;
  std::fflush(stdout);
  std::cout.flush();
  held_stdout() = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (held_stdout() >= 0) dup2(STDERR_FILENO, STDOUT_FILENO);
}

void set_before_report(std::function<void()> hook) { before_report() = std::move(hook); }

void commit_reports(const Report& report, const std::vector<ReportTarget>& targets) {
  {
    // Waits while a firing deadline holds the lock (it ends the process); disarms it otherwise.
    std::lock_guard<std::mutex> lock(g_deadline_mutex);
    ++g_generation;
  }
  set_phase("writing the reports");
  if (before_report()) before_report()();
  std::fflush(stdout);
  std::cout.flush();
  if (held_stdout() >= 0) {
    dup2(held_stdout(), STDOUT_FILENO);
    close(held_stdout());
    held_stdout() = -1;
  }
  write_reports(report, targets, std::cout, use_color());
}

// ---- the Python child -------------------------------------------------------------------------

namespace {

// What the child runs: ckcheck's CLI in the Python of the model, telling the status channel when
// it has started and how it ends, and ending the process itself (a thread the model left running
// does not hold it). An interpreter that cannot import torch and ckcheck says so in one line.
constexpr const char* kBootstrap = R"(import os, sys
fd = int(os.environ.pop("CKCHECK_STATUS_FD", "-1"))
def tell(line):
    try:
        os.write(fd, (line + "\n").encode()) if fd >= 0 else None
    except OSError:
        pass
try:
    import torch
    import ckcheck
    from ckcheck import _core
except KeyboardInterrupt:
    sys.stderr.write("ckcheck: error: stopped by SIGINT (Interrupt) in starting Python; no report was written\n")
    tell("exit 130")
    os._exit(130)
except BaseException as e:
    text = str(e).strip().splitlines()
    sys.stderr.write("ckcheck: error: %s cannot run ckcheck's Python side (%s: %s); set CKCHECK_PYTHON to the Python that has torch and the ckcheck package\n" % (sys.executable, type(e).__name__, text[0] if text else ""))
    tell("exit 2")
    os._exit(2)
if fd >= 0:
    os.set_inheritable(fd, False)
    _core.set_status_fd(fd)
tell("started")
code = ckcheck.main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.flush()
tell("exit %d" % code)
os._exit(code)
)";

volatile sig_atomic_t g_child_signal = 0;
void note_child_signal(int signo) { g_child_signal = signo; }

// What the child said on the status channel.
struct ChildStatus {
  bool started = false;
  std::optional<int> exit_code;
  std::optional<int> exec_errno;
  std::string phase = "starting";
  std::string pending;

  void take(const char* data, size_t n) {
    pending.append(data, n);
    for (size_t cut; (cut = pending.find('\n')) != std::string::npos;) {
      const auto line = pending.substr(0, cut);
      pending.erase(0, cut + 1);
      if (line == "started") started = true;
      if (line.rfind("phase ", 0) == 0) phase = line.substr(6);
      if (line.rfind("exit ", 0) == 0) exit_code = std::atoi(line.c_str() + 5);
      if (line.rfind("exec-failed ", 0) == 0) exec_errno = std::atoi(line.c_str() + 12);
    }
  }
};

void drain(int fd, ChildStatus& status) {
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return;
    status.take(buf, static_cast<size_t>(n));
  }
}

// --timeout's value among the arguments (0: none given).
int timeout_arg(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string v;
    if (args[i] == "--timeout" && i + 1 < args.size()) v = args[i + 1];
    if (args[i].rfind("--timeout=", 0) == 0) v = args[i].substr(10);
    if (!v.empty() && v.find_first_not_of("0123456789") == std::string::npos && v.size() < 7) return std::atoi(v.c_str());
  }
  return 0;
}

[[noreturn]] void become_python(const std::string& python, const std::vector<std::string>& args, pid_t parent,
                                int status_fd, std::optional<std::chrono::steady_clock::time_point> deadline) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  setpgid(0, 0);  // its own group: the supervisor stops it and whatever it started together
  const int fd = dup(status_fd);  // without close-on-exec: the interpreter keeps it
  setenv("CKCHECK_STATUS_FD", std::to_string(fd).c_str(), 1);
  if (deadline) {
    setenv(kDeadlineVariable, std::to_string(deadline->time_since_epoch().count()).c_str(), 1);
  }
  std::vector<std::string> all = {python, "-c", kBootstrap};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(python.c_str(), argv.data());
  const auto line = fmt::format("exec-failed {}\n", errno);
  [[maybe_unused]] const auto n = write(fd, line.data(), line.size());
  _exit(127);
}

std::string signal_text(int signo) {
  const char* name = sigabbrev_np(signo);
  return fmt::format("signal {} (SIG{}: {})", signo, name ? name : "?", strsignal(signo));
}

// --world-size's value among the arguments (1: none given).
int world_size_arg(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string v;
    if (args[i] == "--world-size" && i + 1 < args.size()) v = args[i + 1];
    if (args[i].rfind("--world-size=", 0) == 0) v = args[i].substr(13);
    if (!v.empty() && v.find_first_not_of("0123456789") == std::string::npos && v.size() < 4) return std::atoi(v.c_str());
  }
  return 1;
}

// Sends `signo` to the child's group and gives it `grace` to end; then kills what is left. The exit
// status the child told when it ended through ckcheck (it said what happened itself), else none.
std::optional<int> stop_child(pid_t pid, int signo, std::chrono::milliseconds grace, int status_fd, ChildStatus& status) {
  kill(-pid, signo);
  const auto until = std::chrono::steady_clock::now() + grace;
  bool ended = false;
  while (!ended && std::chrono::steady_clock::now() < until) {
    ended = waitpid(pid, nullptr, WNOHANG) == pid;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  drain(status_fd, status);
  kill(-pid, SIGKILL);  // nothing it started outlives it
  if (!ended) waitpid(pid, nullptr, 0);
  return ended ? status.exit_code : std::nullopt;
}

int fail(const std::string& message) {
  std::cerr << "ckcheck: error: " << message << "\n";
  return 2;
}

// The exit status of a child that ended, and what to say of it.
int judge_child(const std::string& python, int wait_status, const ChildStatus& s) {
  if (s.exit_code) return *s.exit_code;
  if (s.exec_errno) {
    return fail(fmt::format("cannot start {} for the Python model ({}); set CKCHECK_PYTHON to the Python that has "
                            "torch and the ckcheck package", python, std::strerror(*s.exec_errno)));
  }
  const std::string how = WIFSIGNALED(wait_status) ? "was killed by " + signal_text(WTERMSIG(wait_status))
                                                   : fmt::format("exited with status {}", WEXITSTATUS(wait_status));
  if (!s.started) {
    return fail(fmt::format("{} {} before ckcheck started in it; set CKCHECK_PYTHON to the Python that has torch "
                            "and the ckcheck package", python, how));
  }
  if (WIFSIGNALED(wait_status)) {
    const int signo = WTERMSIG(wait_status);
    if (signo == SIGINT || signo == SIGTERM || signo == SIGHUP) {
      // Stopped as asked (the signal reached the model's process): a stop, not a crash.
      std::cerr << fmt::format("ckcheck: error: stopped by {} in {}; no report was written\n", signal_text(signo), s.phase);
      return 128 + signo;
    }
    return fail(fmt::format("the model's process {} in {}; no report was written", how, s.phase));
  }
  return fail(fmt::format("the model exited the process itself with status {} in {} (os._exit or sys.exit in "
                          "the model); no report was written", WEXITSTATUS(wait_status), s.phase));
}

}  // namespace

namespace {

// The child the command watches: its process group, the pipe it tells its phase through, and the
// command's deadline.
struct WatchedChild {
  pid_t pid;
  int fd;
  int timeout;          // --timeout, 0 for none
  bool launches_ranks;  // a launcher of ranks, which keeps the deadline itself
  std::chrono::steady_clock::time_point start;
};

// The same signal to the child, which stops its ranks, cleans up and says so in one line; only a
// child that does not is stopped here, with the line said here.
int stop_for_signal(const WatchedChild& c, int signo, ChildStatus& status) {
  if (const auto told = stop_child(c.pid, signo, std::chrono::seconds(5), c.fd, status)) return *told;
  std::cerr << fmt::format("ckcheck: error: stopped by {} in {}; no report was written\n", signal_text(signo),
                           status.phase);
  return 128 + signo;
}

// Reports begun are finished (all or none), within a few seconds more; a launcher of ranks is
// given time to stop its own at the deadline first.
bool past_deadline(const WatchedChild& c, const ChildStatus& status) {
  const int margin = status.phase == "writing the reports" ? 10 : c.launches_ranks ? 15 : 0;
  return c.timeout > 0 && std::chrono::steady_clock::now() - c.start > std::chrono::seconds(c.timeout + margin);
}

int stop_at_deadline(const WatchedChild& c, ChildStatus& status) {
  if (const auto told = stop_child(c.pid, SIGTERM, std::chrono::seconds(c.launches_ranks ? 5 : 0), c.fd, status);
      told && c.launches_ranks) {
    return *told;
  }
  return fail(fmt::format("the run did not finish within --timeout {} s (it was in {}); stopped, no report "
                          "was written", c.timeout, status.phase));
}

// Watches the child until it ends, a signal comes or the deadline passes; its exit status.
int watch_child(const std::string& python, const WatchedChild& c) {
  ChildStatus status;
  for (;;) {
    pollfd p{c.fd, POLLIN, 0};
    poll(&p, 1, 50);
    drain(c.fd, status);
    int st = 0;
    if (waitpid(c.pid, &st, WNOHANG) == c.pid) {
      drain(c.fd, status);
      kill(-c.pid, SIGKILL);  // nothing it started outlives it
      return judge_child(python, st, status);
    }
    if (g_child_signal != 0) return stop_for_signal(c, g_child_signal, status);
    if (past_deadline(c, status)) return stop_at_deadline(c, status);
  }
}

}  // namespace

int run_python_child(const std::string& python, const std::vector<std::string>& args) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return fail("cannot create a pipe to watch the Python model's process");
  const pid_t parent = getpid();
  struct sigaction sa {}, old[3];
  sa.sa_handler = note_child_signal;
  sigemptyset(&sa.sa_mask);
  const int signals[] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; ++i) sigaction(signals[i], &sa, &old[i]);
  const int timeout = timeout_arg(args);
  // --timeout counts from the start of the whole command (the child's interpreter start included).
  // One process: kept here, naming the phase the child last told. A launcher of ranks (--world-size)
  // keeps the same deadline itself, so that it can name the rank that hung and clean up: here only a
  // backstop after it.
  const auto start = std::chrono::steady_clock::now();
  const bool launches_ranks = world_size_arg(args) > 1 && std::getenv("RANK") == nullptr;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (timeout > 0) deadline = start + std::chrono::seconds(timeout);
  const pid_t pid = fork();
  if (pid < 0) return fail("cannot start the Python model's process: fork failed");
  if (pid == 0) become_python(python, args, parent, pipe_fds[1], deadline);
  close(pipe_fds[1]);
  setpgid(pid, pid);
  fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
  const int result = watch_child(python, WatchedChild{pid, pipe_fds[0], timeout, launches_ranks, start});
  close(pipe_fds[0]);
  for (int i = 0; i < 3; ++i) sigaction(signals[i], &old[i], nullptr);
  return result;
}

}  // namespace ckcheck::cli
