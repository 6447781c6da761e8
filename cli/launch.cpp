#include "cli/launch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "harness/errors.h"
#include "harness/text.h"

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
  }
  return e;
}

int launch_ranks(int world_size, int timeout_s) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) throw UsageError("cannot find this program's own path to start the ranks");
  exe[n] = '\0';
  const std::string self(exe);
  if (self.size() < 7 || self.compare(self.size() - 7, 7, "ckcheck") != 0) {
    throw UsageError("--world-size starts ckcheck itself once per rank; run it from the ckcheck program");
  }
  const int port = free_port();
  char dir_template[] = "/tmp/ckcheck-ranks-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (!dir) throw UsageError("cannot create a temporary folder for the ranks' error output");

  std::vector<pid_t> pids(world_size, -1);
  std::vector<std::string> errs(world_size);
  for (int r = 0; r < world_size; ++r) {
    errs[r] = fmt::format("{}/rank{}.err", dir, r);
    const pid_t pid = fork();
    if (pid < 0) throw UsageError("cannot start the ranks: fork failed");
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      const int err = open(errs[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err >= 0) dup2(err, STDERR_FILENO);
      if (r != 0) {
        // Only rank 0 reports.
        const int null = open("/dev/null", O_WRONLY);
        if (null >= 0) dup2(null, STDOUT_FILENO);
      }
      std::vector<char*> argv{const_cast<char*>(self.c_str())};
      for (const auto& a : command_line()) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(self.c_str(), argv.data());
      _exit(127);
    }
    pids[r] = pid;
  }

  std::vector<int> status(world_size, -1);  // exit status, -1 while running
  const auto start = std::chrono::steady_clock::now();
  std::string problem;
  int failed_rank = -1;
  std::optional<std::chrono::steady_clock::time_point> grace;
  for (;;) {
    bool running = false;
    for (int r = 0; r < world_size; ++r) {
      if (status[r] >= 0) continue;
      int st = 0;
      const pid_t got = waitpid(pids[r], &st, WNOHANG);
      if (got == 0) {
        running = true;
        continue;
      }
      status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      // Rank 0 exits 1 when a check fails; any rank exiting otherwise has failed.
      if (status[r] > 1) {
        // The rank whose own error is the cause, rather than one that lost its peer: prefer the
        // first failure that is not a broken or timed-out connection.
        const bool peer_lost = talks_of_peer(last_line(errs[r]));
        if (failed_rank < 0 || (talks_of_peer(last_line(errs[failed_rank])) && !peer_lost)) {
          failed_rank = r;
          problem = fmt::format("rank {} failed (exit status {}): {}", r, status[r], last_line(errs[r]));
        }
        // The others get a moment to finish or fail on their own before they count as hung.
        if (!grace) grace = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      }
    }
    if (!running) break;
    const auto now = std::chrono::steady_clock::now();
    // A little past the ranks' own timeout, so a rank that gives up waiting can say so first.
    const bool timed_out = now - start > std::chrono::seconds(timeout_s + 10);
    if (timed_out || (grace && now > *grace)) {
      std::vector<int> hung;
      for (int r = 0; r < world_size; ++r) {
        if (status[r] < 0) hung.push_back(r);
      }
      for (int r : hung) kill(pids[r], SIGKILL);
      for (int r : hung) waitpid(pids[r], nullptr, 0);
      const std::string who = fmt::format("{} {}", hung.size() == 1 ? "rank" : "ranks", fmt::join(hung, ", "));
      // The hung rank is the news; a rank that failed meanwhile most likely gave up waiting on it.
      problem = failed_rank < 0
                    ? fmt::format("{} did not finish within --timeout {} s (hung?); stopped", who, timeout_s)
                    : fmt::format("{} did not finish (hung?) and was stopped; rank {} stopped with: {}", who,
                                  failed_rank, last_line(errs[failed_rank]));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (problem.empty()) {
    for (const auto& e : errs) std::remove(e.c_str());
    rmdir(dir);
    return status[0];
  }
  throw UsageError(problem);
}

}  // namespace ckcheck::cli
