// The process groups behind Collective: c10d's own Gloo (CPU) and NCCL (CUDA), with a TCPStore
// hosted by rank 0; and what the ranks saw, gathered on rank 0 through that store.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "harness/runner/data_parallel.h"
#include "harness/runner/runner.h"
#include "harness/support/errors.h"

#if defined(USE_C10D_GLOO) && !defined(CKCHECK_NO_GLOO)
#define CKCHECK_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif
#if defined(USE_C10D_NCCL) && !defined(CKCHECK_NO_NCCL)
#define CKCHECK_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace ckcheck {

#ifdef CKCHECK_GLOO
namespace {

class C10dCollective : public Collective {
 public:
  C10dCollective(int rank, int world, std::string backend, c10::intrusive_ptr<c10d::Store> store,
                 std::function<void(std::vector<torch::Tensor>&)> allreduce, std::function<void()> barrier)
      : rank_(rank), world_(world), backend_(std::move(backend)), store_(std::move(store)),
        allreduce_(std::move(allreduce)), barrier_(std::move(barrier)) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return backend_; }
  void allreduce_sum(std::vector<torch::Tensor>& tensors) override { allreduce_(tensors); }
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key) override {
    const auto v = store_->get(key);
    return std::string(v.begin(), v.end());
  }
  void barrier() override { barrier_(); }

 private:
  int rank_, world_;
  std::string backend_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::function<void(std::vector<torch::Tensor>&)> allreduce_;
  std::function<void()> barrier_;
};

// The store's listening socket, bound to the address the ranks meet on -- 127.0.0.1 for ranks on
// this machine, the address torchrun names otherwise -- never to every interface (c10d's own
// TCPStore server binds all of them). Throws when the address is not one of this machine's.
int listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const auto service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0 || !found) {
    throw std::runtime_error(fmt::format("cannot resolve the store's address {}", host));
  }
  std::string why;
  for (auto* a = found; a; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    why = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  throw std::runtime_error(fmt::format("cannot listen on {}:{} ({})", host, port, why));
}

}  // namespace
#endif

std::unique_ptr<Collective> join_process_group(int rank, int world_size, const std::string& master_addr,
                                               int master_port, bool host_store, const torch::Device& device,
                                               int timeout_seconds) {
#ifndef CKCHECK_GLOO
  throw FieldError("world_size", "this ckcheck was built without c10d's Gloo backend (a LibTorch without it, or no Gloo headers: install libgloo-dev), so @world_size is not available");
#else
  const auto timeout = std::chrono::milliseconds(1000ll * timeout_seconds);
  // A collective gives up in half the run's limit, so that a rank waiting on a hung peer says so
  // (and the launcher can name the peer) before the limit stops them all.
  const auto op_timeout = std::chrono::milliseconds(std::max<int64_t>(1000, 500ll * timeout_seconds));
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(master_port);
    opts.isServer = host_store && rank == 0;
    opts.numWorkers = static_cast<std::size_t>(world_size);
    opts.waitWorkers = true;
    opts.timeout = timeout;
    if (opts.isServer) opts.masterListenFd = listen_on(master_addr == "localhost" ? "127.0.0.1" : master_addr, master_port);
    store = c10::make_intrusive<c10d::TCPStore>(master_addr, opts);
    store->setTimeout(op_timeout);
    if (!host_store) store = c10::make_intrusive<c10d::PrefixStore>("ckcheck", store);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("rank {} could not reach the store at {}:{} within {} s: {}", rank,
                                         master_addr, master_port, timeout_seconds,
                                         std::string(e.what()).substr(0, std::string(e.what()).find('\n'))));
  }
  if (device.is_cuda()) {
#ifdef CKCHECK_NCCL
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = op_timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
    return std::make_unique<C10dCollective>(
        rank, world_size, "nccl", store, [pg](std::vector<torch::Tensor>& t) { pg->allreduce(t)->wait(); },
        [pg] { pg->barrier()->wait(); });
#else
    throw UsageError("CUDA tensors need NCCL, and this ckcheck was built without it (a LibTorch without NCCL, or no nccl.h at build time)");
#endif
  }
  auto options = c10d::ProcessGroupGloo::Options::create(op_timeout);
  const bool loopback = master_addr == "127.0.0.1" || master_addr == "localhost";
  options->devices.push_back(loopback ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                      : c10d::ProcessGroupGloo::createDefaultDevice());
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
  return std::make_unique<C10dCollective>(
      rank, world_size, "gloo", store, [pg](std::vector<torch::Tensor>& t) { pg->allreduce(t)->wait(); },
      [pg] { pg->barrier()->wait(); });
#endif
}

void gather_ranks(Collective* collective, RunRecords& records, const std::string& identity) {
  if (!collective) return;
  RunRecords::Rank mine;
  mine.rank = collective->rank();
  // The state the step's first random draw drew from (watched at the op: a forked or explicit
  // generator too), else the generators after the first call that moved them: ranks seeded alike,
  // or a model that seeds them itself, draw the same masks.
  mine.rng_start = records.checkpointed.rng_start;
  mine.error = records.checkpointed.error;
  for (const auto& c : records.checkpointed.calls) {
    const bool drew = c.rng_consumed || !c.forward_draws.empty();
    if (drew && !mine.draws) {
      mine.rng_start = c.forward_draws.empty() ? c.rng_print : c.forward_draws.front().state;
      mine.first_draw = c.site;
    }
    mine.draws = mine.draws || drew;
    for (const auto& d : c.forward_draws) mine.draws_at.push_back({c.site, d.op, d.state});
    bool differs = false;
    for (const auto& d : c.output_diffs) differs = differs || !d.equal;
    if (drew && differs) mine.replayed = false;
  }
  auto to_json = [&identity](const RunRecords::Rank& k) {
    nlohmann::json draws = nlohmann::json::array();
    for (const auto& d : k.draws_at) draws.push_back({d.site, d.op, d.state});
    return nlohmann::json{{"rank", k.rank}, {"rng_start", k.rng_start}, {"draws", k.draws},
                          {"replayed", k.replayed}, {"error", k.error}, {"first_draw", k.first_draw},
                          {"draws_at", draws}, {"identity", identity}}.dump();
  };
  // Each gather its own keys: one process may run several checks in a row (ckcheck selftest), and a
  // key read before its rank wrote it again would hand rank 0 that rank's previous record. Every rank
  // gathers in lockstep, so their counts agree.
  static int gathers = 0;
  const int gather = gathers++;
  if (mine.rank != 0) {
    collective->set(fmt::format("ckcheck/rank/{}/{}", gather, mine.rank), to_json(mine));
    return;
  }
  records.ranks.push_back(mine);
  for (int r = 1; r < collective->world_size(); ++r) {
    const auto j = nlohmann::json::parse(collective->get(fmt::format("ckcheck/rank/{}/{}", gather, r)));
    if (j.at("identity").get<std::string>() != identity) {
      throw UsageError(fmt::format("rank {} runs {}, but rank 0 runs {}; start every rank with the same command",
                                   r, j.at("identity").get<std::string>(), identity));
    }
    RunRecords::Rank k{j.at("rank").get<int>(), j.at("rng_start").get<uint64_t>(), j.at("draws").get<bool>(),
                       j.at("replayed").get<bool>(), j.at("error").get<std::string>(),
                       j.at("first_draw").get<std::string>()};
    for (const auto& d : j.at("draws_at")) {
      k.draws_at.push_back({d.at(0).get<std::string>(), d.at(1).get<std::string>(), d.at(2).get<uint64_t>()});
    }
    records.ranks.push_back(std::move(k));
  }
}

}  // namespace ckcheck
