#include "cli/launch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <c10/util/Logging.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include "harness/runner/data_parallel.h"
#include "harness/support/errors.h"
#include "harness/support/phase.h"
#include "harness/support/text.h"

namespace ckcheck::cli {

namespace {
std::vector<std::string>& args_store() {
  static std::vector<std::string> args;
  return args;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  if (const auto n = parse_int(v)) return static_cast<int>(*n);
  throw UsageError(fmt::format("environment variable {}='{}' is not an integer", name, v));
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    throw UsageError("could not find a free TCP port on 127.0.0.1 for the ranks to meet on");
  }
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  const std::string prefix = "ckcheck: error: ";
  return last.rfind(prefix, 0) == 0 ? last.substr(prefix.size()) : last;
}

bool talks_of_peer(const std::string& message) {
  if (message.empty()) return true;  // died without a word (a signal): most likely its peer went first
  for (const char* s : {"Connection closed", "Connection reset", "Timed out", "Socket Timeout", "timed out",
                        "Connection refused", "Broken pipe"}) {
    if (message.find(s) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

void set_command_line(const std::vector<std::string>& args) { args_store() = args; }

namespace {
std::vector<std::string>& rank_program_storage() {
  static std::vector<std::string> program;
  return program;
}
}  // namespace

void set_rank_program(const std::vector<std::string>& program) { rank_program_storage() = program; }
const std::vector<std::string>& command_line() { return args_store(); }

std::optional<RankEnvironment> rank_environment() {
  if (!std::getenv("RANK") || !std::getenv("WORLD_SIZE")) return std::nullopt;
  RankEnvironment e;
  e.rank = env_int("RANK", 0);
  e.world_size = env_int("WORLD_SIZE", 1);
  e.local_rank = env_int("LOCAL_RANK", e.rank);
  if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size) {
    throw UsageError(fmt::format("RANK={} and WORLD_SIZE={} do not describe a rank of a group", e.rank, e.world_size));
  }
  if (e.world_size > 1) {
    const char* addr = std::getenv("MASTER_ADDR");
    if (!addr || !std::getenv("MASTER_PORT")) {
      throw UsageError("RANK and WORLD_SIZE are set but MASTER_ADDR or MASTER_PORT is not: set them as torchrun does");
    }
    e.master_addr = addr;
    e.master_port = env_int("MASTER_PORT", 29500);
    if (e.master_port < 1 || e.master_port > 65535) {
      throw UsageError(fmt::format("MASTER_PORT={} is not a TCP port (1 to 65535)", std::getenv("MASTER_PORT")));
    }
    if (*addr == '\0') throw UsageError("MASTER_ADDR is empty: set it to the address of rank 0's machine");
    const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    e.agent_store = agent && std::string(agent) == "True";
  }
  return e;
}

namespace {

// A child's exit status as a shell gives it: its own, or 128 + the signal that ended it.
int exit_status(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0); }

volatile sig_atomic_t g_signal = 0;
void note_signal(int signo) { g_signal = signo; }

// The ranks' error files and their folder, removed however the launcher leaves.
struct RankFolder {
  std::string dir;
  std::vector<std::string> files;
  ~RankFolder() {
    for (const auto& f : files) std::remove(f.c_str());
    if (!dir.empty()) rmdir(dir.c_str());
  }
};

// SIGINT, SIGTERM and SIGHUP noted instead of ending the launcher, while it has ranks to reap.
struct SignalNote {
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old[3];
  SignalNote() {
    g_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = note_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &old[i]);
  }
  ~SignalNote() {
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old[i], nullptr);
  }
};

// Sends `signo` to the ranks still running, gives them a moment, kills what is left and reaps all.
void stop_ranks(const std::vector<pid_t>& pids, std::vector<int>& status, int signo) {
  for (size_t r = 0; r < pids.size(); ++r) {
    if (status[r] < 0 && pids[r] > 0) kill(pids[r], signo);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (size_t r = 0; r < pids.size(); ++r) {
    while (status[r] < 0 && pids[r] > 0) {
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = exit_status(st);
      } else if (std::chrono::steady_clock::now() > until) {
        kill(pids[r], SIGKILL);
        waitpid(pids[r], nullptr, 0);
        status[r] = 128 + SIGKILL;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
}

std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

namespace {

// The program the ranks run: the one set, else this program again.
std::vector<std::string> rank_program() {
  if (!rank_program_storage().empty()) return rank_program_storage();
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) throw UsageError("cannot find this program's own path to start the ranks");
  exe[n] = '\0';
  const std::string self(exe);
  if (self.size() < 7 || self.compare(self.size() - 7, 7, "ckcheck") != 0) {
    throw UsageError("--world-size starts ckcheck itself once per rank; run it from the ckcheck program");
  }
  return {self};
}

// The started ranks: their processes, exit statuses, error and wait-mark files, and the first
// failure that explains the run.
struct Ranks {
  std::vector<pid_t> pids;
  std::vector<int> status;  // exit status, -1 while running
  std::vector<std::string> errs, waits, statuses;  // error output, wait mark, status lines
  int failed_rank = -1;
  int failed_priority = 3;  // how much the first failure explains: 0 most (see reap)
  std::string problem;
  std::optional<std::chrono::steady_clock::time_point> grace;
};

// What a rank told the launcher through its status file: the last phase, and the exit status
// ckcheck chose (none when the process ended otherwise: os._exit, a signal, a crash).
struct Told {
  std::string phase = "starting";
  std::optional<int> exit;
};

Told told_by(const std::string& path) {
  Told t;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("phase ", 0) == 0) t.phase = line.substr(6);
    if (line.rfind("exit ", 0) == 0) t.exit = std::atoi(line.c_str() + 5);
  }
  return t;
}

std::string signal_words(int signo) {
  const char* name = sigabbrev_np(signo);
  return fmt::format("signal {} (SIG{})", signo, name ? name : "?");
}

// In the child: the rank's environment and output, then this program again.
[[noreturn]] void become_rank(const std::vector<std::string>& program, pid_t launcher, int r, int world_size, int port,
                              const Ranks& ranks) {
  // Die with the launcher, whatever ends it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(1);
  setenv("RANK", std::to_string(r).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("CKCHECK_RANK_WAIT_FILE", ranks.waits[r].c_str(), 1);
  setenv("CKCHECK_RANK_STATUS_FILE", ranks.statuses[r].c_str(), 1);
  const int err = open(ranks.errs[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (err >= 0) dup2(err, STDERR_FILENO);
  if (r != 0) {
    // Only rank 0 reports.
    const int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, STDOUT_FILENO);
  }
  std::vector<char*> argv;
  for (const auto& a : program) argv.push_back(const_cast<char*>(a.c_str()));
  for (const auto& a : command_line()) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(program.front().c_str(), argv.data());
  _exit(127);
}

// Reaps the ranks that ended; false when none is running any more. The failure that explains the
// run is the one that explains most: a rank that ended without ckcheck (os._exit, a kill, a crash)
// first, then one that failed on its own, then one that lost a peer.
bool reap(Ranks& ranks) {
  bool running = false;
  for (size_t r = 0; r < ranks.pids.size(); ++r) {
    if (ranks.status[r] >= 0) continue;
    int st = 0;
    if (waitpid(ranks.pids[r], &st, WNOHANG) == 0) {
      running = true;
      continue;
    }
    ranks.status[r] = exit_status(st);
    const auto told = told_by(ranks.statuses[r]);
    std::string problem;
    int priority = 2;
    if (!told.exit) {
      priority = 0;
      problem = WIFSIGNALED(st)
                    ? fmt::format("rank {} was killed by {} in {}", r, signal_words(WTERMSIG(st)), told.phase)
                    : fmt::format("rank {} ended itself with exit status {} in {} (os._exit or sys.exit in the "
                                  "model?), before ckcheck finished there",
                                  r, ranks.status[r], told.phase);
      const auto said = last_line(ranks.errs[r]);
      if (!said.empty()) problem += ": " + said;
    } else {
      // Rank 0 exits 1 when a check fails; any rank exiting otherwise has failed.
      if (ranks.status[r] <= 1) continue;
      const auto said = last_line(ranks.errs[r]);
      priority = talks_of_peer(said) ? 2 : 1;
      problem = fmt::format("rank {} failed (exit status {}): {}", r, ranks.status[r], said);
    }
    if (priority < ranks.failed_priority) {
      ranks.failed_rank = static_cast<int>(r);
      ranks.failed_priority = priority;
      ranks.problem = problem;
    }
    // The others get a moment to finish or fail on their own before they count as hung.
    if (!ranks.grace) ranks.grace = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  }
  return running;
}

// Stops the ranks still running, naming the hung ones: those not waiting on a peer (all, when all wait).
void stop_hung(Ranks& ranks, bool timed_out, int timeout_s) {
  std::vector<int> hung, all;
  for (size_t r = 0; r < ranks.pids.size(); ++r) {
    if (ranks.status[r] >= 0) continue;
    all.push_back(static_cast<int>(r));
    if (access(ranks.waits[r].c_str(), F_OK) != 0) hung.push_back(static_cast<int>(r));
  }
  if (hung.empty()) hung = all;
  stop_ranks(ranks.pids, ranks.status, SIGKILL);
  // The hung rank is the news; a rank that failed meanwhile most likely gave up waiting on it.
  ranks.problem =
      ranks.failed_rank < 0
          ? fmt::format("{} did not finish within --timeout {} s (the limit of the whole run; hung?); stopped",
                        ranks_text(hung), timeout_s)
          : timed_out ? fmt::format("{}; {} did not finish within --timeout {} s (hung?) and {} stopped", ranks.problem,
                                    ranks_text(hung), timeout_s, hung.size() == 1 ? "was" : "were")
                      : fmt::format("{}; {}, still running, {} stopped", ranks.problem, ranks_text(all),
                                    all.size() == 1 ? "was" : "were");
}

// A signal to the launcher: passed on to the ranks, which are reaped; the launcher's exit status.
int stop_on_signal(Ranks& ranks) {
  const int signo = g_signal;
  std::vector<int> running;
  for (size_t r = 0; r < ranks.pids.size(); ++r) {
    if (ranks.status[r] < 0) running.push_back(static_cast<int>(r));
  }
  stop_ranks(ranks.pids, ranks.status, signo);
  std::cerr << fmt::format("ckcheck: error: stopped by {}{}; no report was written\n", strsignal(signo),
                           running.empty() ? "" : ", and so were " + ranks_text(running));
  return 128 + signo;
}

}  // namespace

std::chrono::steady_clock::time_point run_deadline(int timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  // A supervising ckcheck counts --timeout from the start of the whole command: its deadline, on
  // the same monotonic clock, is this one where it comes first.
  if (const char* given = std::getenv(kDeadlineVariable)) {
    const auto ns = std::strtoll(given, nullptr, 10);
    if (ns > 0) deadline = std::min(deadline, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns)));
  }
  return deadline;
}

void check_batch_splits(Model& model, uint64_t seed, int world_size) {
  const auto inputs = model.make_inputs(seed);
  if (!inputs.empty() && inputs[0].dim() > 0 && inputs[0].size(0) % world_size != 0) {
    throw UsageError(fmt::format("the batch ({} rows) does not split evenly over --world-size {}; choose a "
                                 "batch that is a multiple of it",
                                 inputs[0].size(0), world_size));
  }
}

int launch_ranks(int world_size, int timeout_s) {
  const auto self = rank_program();
  const int port = free_port();
  RankFolder folder;
  const char* tmp = std::getenv("TMPDIR");
  std::string dir_template = std::string(tmp && *tmp ? tmp : "/tmp") + "/ckcheck-ranks-XXXXXX";
  const char* dir = mkdtemp(dir_template.data());
  if (!dir) throw UsageError("cannot create a temporary folder for the ranks' error output");
  folder.dir = dir;

  SignalNote signals;
  const pid_t launcher = getpid();
  Ranks ranks;
  ranks.pids.assign(world_size, -1);
  ranks.status.assign(world_size, -1);
  for (int r = 0; r < world_size; ++r) {
    ranks.errs.push_back(fmt::format("{}/rank{}.err", dir, r));
    ranks.waits.push_back(fmt::format("{}/rank{}.wait", dir, r));
    ranks.statuses.push_back(fmt::format("{}/rank{}.status", dir, r));
    folder.files.push_back(ranks.errs.back());
    folder.files.push_back(ranks.waits.back());
    folder.files.push_back(ranks.statuses.back());
    const pid_t pid = fork();
    if (pid < 0) {
      stop_ranks(ranks.pids, ranks.status, SIGKILL);
      throw UsageError("cannot start the ranks: fork failed");
    }
    if (pid == 0) become_rank(self, launcher, r, world_size, port, ranks);
    ranks.pids[r] = pid;
  }

  const auto deadline = run_deadline(timeout_s);
  for (;;) {
    if (g_signal != 0) return stop_on_signal(ranks);
    if (!reap(ranks)) break;
    const auto now = std::chrono::steady_clock::now();
    const bool timed_out = now >= deadline;
    if (timed_out || (ranks.grace && now > *ranks.grace)) {
      stop_hung(ranks, timed_out, timeout_s);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (ranks.problem.empty()) return ranks.status[0];
  throw UsageError(ranks.problem);
}

namespace {

class WaitMarkedCollective : public Collective {
 public:
  WaitMarkedCollective(std::unique_ptr<Collective> inner, std::string file)
      : inner_(std::move(inner)), file_(std::move(file)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }
  void allreduce_sum(std::vector<torch::Tensor>& tensors) override {
    Waiting w(file_);
    inner_->allreduce_sum(tensors);
  }
  void set(const std::string& key, const std::string& value) override { inner_->set(key, value); }
  std::string get(const std::string& key) override {
    Waiting w(file_);
    return inner_->get(key);
  }
  void barrier() override {
    Waiting w(file_);
    inner_->barrier();
  }

 private:
  struct Waiting {
    const std::string& file;
    explicit Waiting(const std::string& f) : file(f) {
      const int fd = open(file.c_str(), O_WRONLY | O_CREAT, 0644);
      if (fd >= 0) close(fd);
    }
    ~Waiting() { unlink(file.c_str()); }
  };
  std::unique_ptr<Collective> inner_;
  std::string file_;
};

}  // namespace

std::unique_ptr<Collective> mark_waits(std::unique_ptr<Collective> collective) {
  const char* file = std::getenv("CKCHECK_RANK_WAIT_FILE");
  if (!file || !*file) return collective;
  return std::make_unique<WaitMarkedCollective>(std::move(collective), file);
}

void guard_rank(int rank, int world_size, int timeout_s) {
  // c10d logs connection trouble over several lines; ckcheck says what went wrong in one.
  FLAGS_caffe2_log_level = c10::GLOG_FATAL;
  // Under ckcheck's launcher, which names the rank that hung at the deadline, a backstop only.
  const char* launched = std::getenv("CKCHECK_RANK_STATUS_FILE");
  const auto until = run_deadline(timeout_s) + std::chrono::seconds(launched && *launched ? 10 : 0);
  std::thread([rank, world_size, timeout_s, until] {
    std::this_thread::sleep_until(until);
    std::fprintf(stderr,
                 "ckcheck: error: rank %d of %d: the data-parallel run did not finish within --timeout %d s (the "
                 "limit of the whole run); stopped -- are all ranks started and MASTER_ADDR:MASTER_PORT reachable?\n",
                 rank, world_size, timeout_s);
    std::fflush(stderr);
    tell_exit(2);
    _exit(2);
  }).detach();
}

}  // namespace ckcheck::cli
