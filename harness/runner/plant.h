// A bug planted into one site of a model, for `ckcheck selftest`: proof, on the user's own model and
// configuration, that each class of bug ckcheck claims to catch is caught there. The site's function
// is wrapped in every step, plain and checkpointed alike, as the model's own code would be; what a
// broken checkpoint does (lose the RNG state or autocast in the recompute) happens where the
// recompute runs, the backward.
#pragma once

#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckcheck/model.h"

namespace ckcheck {

enum class PlantKind {
  kRngNotReplayed,     // dropout whose recompute draws from a shifted RNG state (a checkpoint that loses it)
  kInputInPlace,       // the site's input changed in place after its forward (invisible to autograd)
  kStateTwice,         // a counter of the site's updated at every call: again by the recompute
  kAutocastLost,       // the recompute runs without the forward's autocast (with --amp)
  kRandomRecomputed,   // noise from a generator of the site's own, drawn anew by the recompute
  kLostGradient,       // an auxiliary loss made inside the site: lost where the forward runs without autograd
  kRankSameMask,       // a dropout mask from a generator seeded alike on every rank (with --world-size)
  kHookTwice,          // the site reads a parameter from outside it: its gradient hook fires per backward task
};

/// One class of planted bug: its name (the selftest's row), the cause ckcheck must name, and what
/// the plant does, in words.
struct PlantClass {
  PlantKind kind;
  const char* name;
  const char* cause;
  const char* what;
};

/// Every class, in the selftest's order.
const std::vector<PlantClass>& plant_classes();
const PlantClass& plant_class(PlantKind kind);
/// By name; nullopt for an unknown one.
std::optional<PlantKind> parse_plant_kind(const std::string& name);

/// A plant at one site. The runner calls begin_step() as each run of steps begins, wraps the site's
/// function with wrap() in the plain and the checkpointed step alike, tells it when the backward
/// runs (a recompute runs there), adds take_aux() to the loss, and records state_record().
class Plant {
 public:
  Plant(PlantKind kind, std::string site);

  PlantKind kind() const { return kind_; }
  const std::string& site() const { return site_; }

  /// A run of steps begins: fresh generators, counter and auxiliary terms; the outside parameter
  /// (kHookTwice) chosen among `model`'s.
  void begin_run(Model& model, uint64_t seed);
  /// The backward begins (true) or ends (false): a recompute runs while it does.
  void set_backward(bool backward) { backward_ = backward; }
  /// The site's function with the plant in it.
  SiteFn wrap(const SiteFn& fn);
  /// kLostGradient: the auxiliary terms the forward made since the last call, to add to the loss
  /// (those without a graph -- made in a forward run without autograd -- cannot add anything).
  std::vector<torch::Tensor> take_aux();
  /// kStateTwice: the counter, as a state record of the site ("SITE.ckcheck_plant_counter").
  std::optional<std::pair<std::string, torch::Tensor>> state() const;
  /// How often the planted site ran outside a backward since begin_run(): a plant judges a site
  /// the plain and the checkpointed step both call alike.
  int64_t forward_calls() const { return forward_calls_; }

 private:
  std::vector<torch::Tensor> planted(const SiteFn& fn, const std::vector<torch::Tensor>& xs);
  // The plant's change to the site's largest floating-point output `y` (its inputs `xs`).
  void alter(torch::Tensor& y, const std::vector<torch::Tensor>& xs, bool recompute);

  PlantKind kind_;
  std::string site_;
  bool backward_ = false;
  int64_t forward_calls_ = 0;
  uint64_t seed_ = 0;
  at::Generator own_generator_;
  torch::Tensor counter_;
  torch::Tensor outside_;  // kHookTwice: a parameter outside the site
  std::vector<torch::Tensor> aux_;
};

}  // namespace ckcheck
