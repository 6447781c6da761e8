#include "harness/runner/plant.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "harness/support/global_state.h"

namespace ckcheck {

const std::vector<PlantClass>& plant_classes() {
  // hook-twice last: under DDP its planted step stops in the backward, which may leave the ranks'
  // collectives out of step for a run after it.
  static const std::vector<PlantClass> classes = {
      {PlantKind::kRngNotReplayed, "rng-not-replayed", "rng",
       "dropout whose recompute draws from another RNG state than its forward"},
      {PlantKind::kInputInPlace, "input-in-place", "in-place",
       "the site's input changed in place after its forward, unseen by autograd (.data)"},
      {PlantKind::kStateTwice, "state-twice", "buffer-update",
       "a counter of the site's, updated at every call: again by the recompute"},
      {PlantKind::kAutocastLost, "autocast-lost", "autocast", "the recompute runs without the forward's autocast"},
      {PlantKind::kRandomRecomputed, "random-recomputed", "rng",
       "multiplicative noise from a generator of the site's own, drawn anew by the recompute"},
      {PlantKind::kLostGradient, "lost-gradient", "reentrant-no-grad",
       "an auxiliary loss made inside the site (1% of the site's output gradient), lost where its forward runs "
       "without autograd"},
      {PlantKind::kRankSameMask, "rank-same-mask", "rng",
       "a dropout mask from a generator seeded alike on every rank"},
      {PlantKind::kHookTwice, "hook-twice", "hook-count",
       "the site reads a parameter from outside it, whose gradient hook fires once per backward task"},
  };
  return classes;
}

const PlantClass& plant_class(PlantKind kind) {
  for (const auto& c : plant_classes()) {
    if (c.kind == kind) return c;
  }
  return plant_classes().front();
}

std::optional<PlantKind> parse_plant_kind(const std::string& name) {
  for (const auto& c : plant_classes()) {
    if (name == c.name) return c.kind;
  }
  return std::nullopt;
}

namespace {

// The floating tensor of `ts` with the most elements (the hidden state), or -1.
int largest_floating(const std::vector<torch::Tensor>& ts) {
  int best = -1;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].defined() || !ts[i].is_floating_point() || ts[i].numel() == 0) continue;
    if (best < 0 || ts[i].numel() > ts[best].numel()) best = static_cast<int>(i);
  }
  return best;
}

// A mask keeping 90% of the elements, drawn from `gen` (the default generator when undefined).
torch::Tensor keep_mask(const torch::Tensor& like, std::optional<at::Generator> gen = std::nullopt) {
  auto p = torch::full(like.sizes(), 0.9, like.options());
  return (gen ? torch::bernoulli(p, *gen) : torch::bernoulli(p)) / 0.9;
}

uint64_t site_hash(const std::string& site) {
  uint64_t h = 1469598103934665603ull;
  for (char c : site) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

}  // namespace

Plant::Plant(PlantKind kind, std::string site) : kind_(kind), site_(std::move(site)) {}

void Plant::begin_run(Model& model, uint64_t seed) {
  seed_ = seed;
  aux_.clear();
  backward_ = false;
  forward_calls_ = 0;
  own_generator_ = at::make_generator<at::CPUGeneratorImpl>(seed * 7919 + 17);
  counter_ = torch::zeros({1}, torch::kFloat);
  outside_ = torch::Tensor();
  if (kind_ == PlantKind::kHookTwice) {
    // A parameter the site does not own, read beside the site's own: a shared weight.
    for (const auto& [name, p] : model.named_parameters()) {
      if (!site_within(name, site_) && p.requires_grad() && p.is_floating_point()) {
        outside_ = p;
        break;
      }
    }
  }
}

std::vector<torch::Tensor> Plant::take_aux() {
  std::vector<torch::Tensor> out;
  out.swap(aux_);
  return out;
}

std::optional<std::pair<std::string, torch::Tensor>> Plant::state() const {
  if (kind_ != PlantKind::kStateTwice || !counter_.defined()) return std::nullopt;
  return std::make_pair(site_ + ".ckcheck_plant_counter", counter_.clone());
}

SiteFn Plant::wrap(const SiteFn& fn) {
  return [this, fn](const std::vector<torch::Tensor>& xs) { return planted(fn, xs); };
}

std::vector<torch::Tensor> Plant::planted(const SiteFn& fn, const std::vector<torch::Tensor>& xs) {
  const bool recompute = backward_;
  if (!recompute) ++forward_calls_;
  if (kind_ == PlantKind::kAutocastLost && recompute) {
    const AutocastScope off(AutocastState{});  // every device's autocast off
    return fn(xs);
  }
  if (kind_ == PlantKind::kStateTwice) {
    torch::NoGradGuard no_grad;
    counter_.add_(1);
  }
  auto ys = fn(xs);
  const int out = largest_floating(ys);
  if (out >= 0) alter(ys[out], xs, recompute);
  return ys;
}

void Plant::alter(torch::Tensor& y, const std::vector<torch::Tensor>& xs, bool recompute) {
  switch (kind_) {
    case PlantKind::kRngNotReplayed:
      // A checkpoint that lost the RNG state: the recompute's stream is one draw further on.
      if (recompute) torch::rand({1}, y.options().requires_grad(false));
      y = y * keep_mask(y);
      break;
    case PlantKind::kInputInPlace:
      if (!recompute) {
        const int in = largest_floating(xs);
        if (in >= 0) {
          auto data = xs[in].variable_data();  // unseen by autograd: no version bump
          data.add_(0.5);
        }
      }
      break;
    case PlantKind::kRandomRecomputed: {
      auto noise = torch::randn(y.sizes(), own_generator_, torch::TensorOptions().dtype(torch::kFloat));
      y = y * (1.0 + 0.05 * noise.to(y.options().requires_grad(false)));
      break;
    }
    case PlantKind::kLostGradient: {
      // Computed in the recompute too, as the model's code would be (a checkpoint compares what its
      // forward and its recompute save); kept from the forward only, as a model collects it.
      // Fixed weights, no random op (every rank computes the same term, as a loss does).
      const double phase = static_cast<double>((site_hash(site_) + seed_) % 1000) / 1000.0;
      auto w = torch::cos(torch::arange(y.numel(), torch::TensorOptions().dtype(torch::kFloat)) * 0.37 + phase)
                   .reshape(y.sizes())
                   .to(y.options().requires_grad(false));
      auto term = 0.01 * (y * w).sum();
      if (!recompute) aux_.push_back(term);
      break;
    }
    case PlantKind::kHookTwice:
      if (outside_.defined()) y = y + 0.0 * outside_.sum().to(y.dtype());
      break;
    case PlantKind::kRankSameMask: {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(4242);  // the same seed on every rank
      y = y * keep_mask(y.to(torch::kCPU), gen).to(y.device());
      break;
    }
    case PlantKind::kStateTwice:
    case PlantKind::kAutocastLost:
      break;
  }
}

}  // namespace ckcheck
