#include "harness/runner/data_parallel.h"

#include <fmt/format.h>

#include "harness/support/enum_names.h"
#include "harness/support/errors.h"

namespace ckcheck {

namespace {

constexpr EnumName<ParallelKind> kParallelNames[] = {
    {ParallelKind::kOff, "off"}, {ParallelKind::kDdp, "ddp"}, {ParallelKind::kFsdp, "fsdp"}};

}  // namespace

const char* parallel_kind_name(ParallelKind kind) { return name_in(kParallelNames, kind); }

ParallelKind parse_parallel_kind(const std::string& name) {
  if (const auto kind = parse_in(kParallelNames, name)) return *kind;
  throw UsageError(fmt::format("unknown data-parallel engine '{}'; engines: off, ddp, fsdp", name));
}

DataParallel::DataParallel(Collective& collective, int64_t bucket_bytes)
    : collective_(collective), bucket_bytes_(bucket_bytes) {}

DataParallel::DataParallel(Collective& collective, ParallelEngine& engine)
    : collective_(collective), engine_(&engine), bucket_bytes_(0) {}

void DataParallel::begin_run() {
  if (engine_) engine_->use_engine(true);
}

void DataParallel::end_run() {
  if (engine_) engine_->use_engine(false);
}

torch::Tensor DataParallel::shard(const torch::Tensor& global) const {
  const int64_t world = world_size();
  if (global.dim() == 0) return global;
  const int64_t n = global.size(0);
  if (n % world != 0) {
    throw FieldError("world_size", fmt::format("the global batch ({} rows) does not split evenly over {} ranks; "
                                               "choose a batch that is a multiple of @world_size",
                                 n, world));
  }
  const int64_t per = n / world;
  return global.narrow(0, rank() * per, per).clone();
}

void DataParallel::begin_backward(const NamedTensors& params) {
  if (engine_) return;
  if (buckets_.empty() || names_.size() != params.size()) {
    buckets_.clear();
    bucket_of_.assign(params.size(), 0);
    names_.clear();
    for (const auto& [name, p] : params) names_.push_back(name);
    int64_t filled = bucket_bytes_;
    for (size_t k = params.size(); k-- > 0;) {
      const auto& p = params[k].second;
      if (!p.requires_grad()) continue;
      const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
      if (buckets_.empty() || filled + bytes > bucket_bytes_) {
        buckets_.emplace_back();
        filled = 0;
      }
      buckets_.back().push_back(k);
      bucket_of_[k] = buckets_.size() - 1;
      filled += bytes;
    }
  }
  fired_.assign(params.size(), 0);
  grads_.assign(params.size(), torch::Tensor());
  params_.clear();
  for (const auto& [name, p] : params) params_.push_back(p);
  reduced_.assign(buckets_.size(), false);
  ready_twice.clear();
  never_ready.clear();
}

void DataParallel::gradient_ready(size_t index, const torch::Tensor& grad) {
  if (engine_ || index >= fired_.size()) return;
  if (++fired_[index] == 2) ready_twice.push_back(names_[index]);
  if (grad.defined()) {
    grads_[index] = grads_[index].defined() ? grads_[index] + grad.detach() : grad.detach().clone();
  } else if (!grads_[index].defined()) {
    // A hook that fires without a gradient (an output the loss does not use): DDP reduces zeros.
    grads_[index] = torch::zeros_like(params_[index]);
  }
  const size_t b = bucket_of_[index];
  if (reduced_[b]) return;
  for (size_t k : buckets_[b]) {
    if (fired_[k] == 0) return;
  }
  reduce_bucket(b);
}

void DataParallel::reduce_bucket(size_t b) {
  std::vector<torch::Tensor> flat;
  std::vector<torch::Tensor> parts;
  for (size_t k : buckets_[b]) parts.push_back(grads_[k].reshape({-1}));
  flat.push_back(torch::cat(parts));
  collective_.allreduce_sum(flat);
  int64_t offset = 0;
  for (size_t k : buckets_[b]) {
    const int64_t n = grads_[k].numel();
    grads_[k] = flat[0].narrow(0, offset, n).view(grads_[k].sizes()) / world_size();
    offset += n;
  }
  reduced_[b] = true;
}

// Rank 0 hosts the store: it waits for every other rank to say it has read what it needed
// before it goes on, so that it can never end the run while a peer still reads from it.
void DataParallel::acknowledge(const std::string& key) {
  if (rank() != 0) {
    collective_.set(key + "ack/" + std::to_string(rank()), "1");
    return;
  }
  for (int r = 1; r < world_size(); ++r) collective_.get(key + "ack/" + std::to_string(r));
}

bool DataParallel::any_rank(bool mine) {
  const auto key = fmt::format("ckcheck/agree/{}/", agreements_++);
  collective_.set(key + std::to_string(rank()), mine ? "1" : "0");
  bool any = mine;
  for (int r = 0; r < world_size(); ++r) {
    if (r != rank()) any = collective_.get(key + std::to_string(r)) == "1" || any;
  }
  acknowledge(key);
  return any;
}

std::string DataParallel::rank0(const std::string& value) {
  const auto key = fmt::format("ckcheck/agree/{}/", agreements_++);
  std::string agreed = value;
  if (rank() == 0) {
    collective_.set(key + "0", value);
  } else {
    agreed = collective_.get(key + "0");
  }
  acknowledge(key);
  return agreed;
}

std::vector<std::string> engine_op_scopes(const DataParallel* dp) {
  return dp && dp->engine() ? dp->engine()->engine_op_scopes() : std::vector<std::string>{};
}

std::string engine_mixed_precision(const DataParallel* dp) {
  return dp && dp->engine() ? dp->engine()->engine_mixed_precision() : "off";
}

std::optional<std::vector<int64_t>> DataParallel::hook_fires() const {
  return engine_ ? engine_->engine_hook_fires() : std::nullopt;
}

void DataParallel::end_step(const NamedTensors& params) {
  if (engine_) {
    engine_->engine_step_done();
    return;
  }
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    bool twice = false;
    for (size_t k : buckets_[b]) {
      if (fired_[k] == 0) never_ready.push_back(names_[k]);
      twice = twice || fired_[k] > 1;
    }
    // DDP would stop here ("Expected to mark a variable ready only once"); to compare gradients
    // anyway, a bucket reduced early or never is reduced from the final gradients.
    if (twice || !reduced_[b]) {
      for (size_t k : buckets_[b]) {
        const auto& g = params[k].second.grad();
        grads_[k] = g.defined() ? g.detach().clone() : torch::zeros_like(params[k].second);
      }
      reduce_bucket(b);
    }
    for (size_t k : buckets_[b]) params[k].second.mutable_grad() = grads_[k];
  }
}

}  // namespace ckcheck
