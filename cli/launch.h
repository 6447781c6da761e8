// Data-parallel runs: starting N ranks of ckcheck on this machine, or joining a group that a
// launcher such as torchrun started (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ckcheck {
class Collective;
class Model;
}

namespace ckcheck::cli {

/// The arguments ckcheck was started with (after the program name), for starting ranks.
void set_command_line(const std::vector<std::string>& args);
const std::vector<std::string>& command_line();

/// The program a rank runs, before those arguments: this ckcheck by default; a Python process
/// running ckcheck's CLI names itself ({python, "-m", "ckcheck"}).
void set_rank_program(const std::vector<std::string>& program);

struct RankEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True):
  /// every rank joins it, none hosts one.
  bool agent_store = false;
};

/// The rank this process is, when RANK and WORLD_SIZE say so; throws UsageError when they are
/// malformed or MASTER_ADDR/MASTER_PORT are missing.
std::optional<RankEnvironment> rank_environment();

/// Starts `world_size` copies of this ckcheck as ranks 0..N-1 meeting on loopback and returns
/// rank 0's exit status. Rank 0's standard output comes through. `timeout_s` is the wall-clock
/// limit of the whole run: past it, or when a rank fails, the others are stopped and a UsageError
/// names the rank. SIGINT, SIGTERM and SIGHUP are forwarded to the ranks, which are reaped; the
/// return is then 128 + the signal. Ranks die with the launcher (PR_SET_PDEATHSIG), and the
/// folder of their error output is removed on every path.
int launch_ranks(int world_size, int timeout_s);

/// The environment variable through which a supervising ckcheck hands its --timeout deadline to the
/// process it watches (nanoseconds on the monotonic clock), so that both count it from the start of
/// the whole command and the launcher, which can name a hung rank, stops first.
constexpr const char* kDeadlineVariable = "CKCHECK_DEADLINE_NS";

/// The end of a run limited to `timeout_s` seconds from now, or the supervisor's deadline where that
/// comes first.
std::chrono::steady_clock::time_point run_deadline(int timeout_s);

/// Throws UsageError when the model's batch does not split evenly over `world_size` ranks.
void check_batch_splits(Model& model, uint64_t seed, int world_size);

/// In a rank: stops the process with one line and exit status 2 once `timeout_s` seconds have
/// passed (the run's wall-clock limit, under this launcher or torchrun), and silences c10d's own
/// logging, whose errors ckcheck reports itself in one line.
void guard_rank(int rank, int world_size, int timeout_s);

/// In a rank started by launch_ranks: the collective, marking while it waits on its peers (a file
/// the launcher looks at), so that at the time limit the launcher names the rank that hung
/// rather than the ones waiting for it. Elsewhere the collective itself.
std::unique_ptr<Collective> mark_waits(std::unique_ptr<Collective> collective);

}  // namespace ckcheck::cli
