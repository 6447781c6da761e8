// Data-parallel runs: starting N ranks of ckcheck on this machine, or joining a group that a
// launcher such as torchrun started (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ckcheck::cli {

/// The arguments ckcheck was started with (after the program name), for starting ranks.
void set_command_line(const std::vector<std::string>& args);
const std::vector<std::string>& command_line();

struct RankEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

/// The rank this process is, when RANK and WORLD_SIZE say so; throws UsageError when they are
/// malformed or MASTER_ADDR/MASTER_PORT are missing.
std::optional<RankEnvironment> rank_environment();

/// Starts `world_size` copies of this ckcheck as ranks 0..N-1 meeting on loopback, waits up to
/// `timeout_s` for them, and returns rank 0's exit status. Rank 0's standard output comes through;
/// when a rank fails or hangs, the others are stopped and a UsageError names the rank.
int launch_ranks(int world_size, int timeout_s);

}  // namespace ckcheck::cli
