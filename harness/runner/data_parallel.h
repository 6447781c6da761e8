// Data-parallel gradient reduction as DistributedDataParallel does it: each parameter's gradient
// hook marks it ready, and a bucket of parameters is all-reduced once all of its parameters are
// ready. The process group behind it is a Collective (Gloo on the CPU, NCCL on CUDA).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckcheck/model.h"
#include "harness/runner/step_participant.h"

namespace ckcheck {

/// What data parallelism needs from a process group, plus a small key-value store to gather
/// results on rank 0.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;
  /// Sums the tensors over all ranks, in place; blocks until done.
  virtual void allreduce_sum(std::vector<torch::Tensor>& tensors) = 0;
  virtual void set(const std::string& key, const std::string& value) = 0;
  /// Waits for the key (up to the group's timeout) and returns its value.
  virtual std::string get(const std::string& key) = 0;
  virtual void barrier() = 0;
};

/// Joins a process group: Gloo for CPU tensors, NCCL for CUDA ones (when this LibTorch has it).
/// Rank 0 hosts the store at master_addr:master_port, or (`host_store` false) a launcher's agent
/// does, and ckcheck's keys go under a prefix of their own there. Throws UsageError when the backend is
/// missing, and std::runtime_error naming the address when the group cannot be formed in time.
std::unique_ptr<Collective> join_process_group(int rank, int world_size, const std::string& master_addr,
                                               int master_port, bool host_store, const torch::Device& device,
                                               int timeout_seconds);

struct RunRecords;

/// What every rank saw, gathered on rank 0 (into `records.ranks`) through the group's store before
/// the checks run; other ranks only hand theirs over. `identity` says what this rank runs (model,
/// parameters, checkpoint, plan): a rank started with another command than rank 0's (torchrun
/// nodes given other options) is refused in one line (UsageError). Nothing to do without a group.
void gather_ranks(Collective* collective, RunRecords& records, const std::string& identity);

/// A model trained data-parallel by an engine of its own -- a Python model under PyTorch's
/// DistributedDataParallel: the engine reduces the gradients; the runner still shards the batch,
/// seeds each rank, and says which steps run through the engine (the single-process reference
/// runs the bare model).
/// The engine a Python model trains data-parallel through (--parallel): none, PyTorch's
/// DistributedDataParallel or FSDP2 (fully_shard).
enum class ParallelKind { kOff, kDdp, kFsdp };
/// "off", "ddp", "fsdp": as --parallel names it.
const char* parallel_kind_name(ParallelKind kind);
/// The kind --parallel `name` gives (UsageError for another).
ParallelKind parse_parallel_kind(const std::string& name);

class ParallelEngine {
 public:
  virtual ~ParallelEngine() = default;
  /// The engine, or kOff where the model was not put into one (it trains alone).
  virtual ParallelKind engine() const = 0;
  /// The engine's process group (the model joined it when it was built), for gathering results.
  virtual std::unique_ptr<Collective> engine_collective() = 0;
  /// Whether the steps from now on run through the engine (false: the bare model).
  virtual void use_engine(bool on) = 0;
  /// After a step's backward: throws, with the engine's own message, when it did not finish the
  /// step's reduction (a parameter whose gradient never came).
  virtual void engine_step_done() = 0;
  /// After a backward through the engine: each parameter's gradient hook count, where the engine
  /// fires hooks of its own in place of the parameters' (nullopt: the parameters' hooks fire).
  virtual std::optional<std::vector<int64_t>> engine_hook_fires() { return std::nullopt; }
  /// The dtype the engine computes in where it casts the parameters itself (FSDP2's mixed
  /// precision: "bf16", "fp16"), or "off".
  virtual std::string engine_mixed_precision() const { return "off"; }
  /// Prefixes of the record_function scopes the engine runs its own ops in (FSDP2's "FSDP::"):
  /// op traces leave those ops out, as they are the engine's work and not the model's.
  virtual std::vector<std::string> engine_op_scopes() const { return {}; }
};

/// The engine's own op scopes where a data-parallel run has an engine, else none.
std::vector<std::string> engine_op_scopes(const class DataParallel* dp);

/// The engine's mixed precision ("bf16", "fp16") where a data-parallel run has one, else "off".
std::string engine_mixed_precision(const class DataParallel* dp);

/// Data parallelism as a participant of the step: the Runner shards, seeds and reduces through it.
class DataParallel : public StepParticipant {
 public:
  /// Parameters go into buckets of at most `bucket_bytes`, in reverse order (DDP's default is
  /// 25 MiB: the last layers' gradients are ready first).
  explicit DataParallel(Collective& collective, int64_t bucket_bytes = 25ll << 20);
  /// Through the model's own engine, which reduces the gradients itself.
  DataParallel(Collective& collective, ParallelEngine& engine);

  /// The engine that reduces, or null when this participant reduces itself.
  const ParallelEngine* engine() const { return engine_; }

  int rank() const { return collective_.rank(); }
  int world_size() const { return collective_.world_size(); }

  /// Each rank its own random stream; the global batch is world_size of this rank's.
  uint64_t seed_offset() const override { return 1000003ull * static_cast<uint64_t>(rank()); }
  int64_t batch_multiple() const override { return world_size(); }
  /// This rank's rows of a tensor whose first dimension is the global batch.
  torch::Tensor shard(const torch::Tensor& global) const override;

  bool watches_gradients() const override { return engine_ == nullptr; }
  /// Before a backward: forget the last step's readiness.
  void begin_backward(const NamedTensors& params) override;
  /// A parameter's gradient hook fired with `grad`.
  void gradient_ready(size_t index, const torch::Tensor& grad) override;
  /// After the backward: reduce what is left, and leave every gradient averaged over the ranks.
  void end_step(const NamedTensors& params) override;
  std::optional<std::vector<int64_t>> hook_fires() const override;
  void begin_run() override;
  void end_run() override;

  /// Whether `mine` holds on any rank. Every rank calls it at the same point of the same sequence
  /// (what a rank runs next may depend on it); it waits for all of them, and rank 0 returns only
  /// once every other rank has read the answer (it hosts the store and may end the run next).
  bool any_rank(bool mine);
  /// Rank 0's `value`, on every rank (called as any_rank is).
  std::string rank0(const std::string& value);

  /// Parameters whose hook fired more than once, or never, in the last step.
  std::vector<std::string> ready_twice, never_ready;

 private:
  void reduce_bucket(size_t b);
  void acknowledge(const std::string& key);

  Collective& collective_;
  ParallelEngine* engine_ = nullptr;
  int64_t bucket_bytes_;
  std::vector<std::vector<size_t>> buckets_;  // parameter indices
  std::vector<size_t> bucket_of_;
  std::vector<int> fired_;
  std::vector<torch::Tensor> grads_;  // what the hooks gave
  std::vector<torch::Tensor> params_;  // of the backward under way
  std::vector<bool> reduced_;
  std::vector<std::string> names_;
  int64_t agreements_ = 0;  // the sequence number of the next any_rank or rank0
};

}  // namespace ckcheck
