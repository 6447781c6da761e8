// Which sites a step checkpoints: parsed from a policy string and the --sites globs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ckcheck/model.h"

namespace ckcheck {

/// A checkpoint policy, as given on the command line:
///   none          nothing is checkpointed (the reference)
///   every:K       every K-th candidate site, starting with the first (every:1 = all of them)
///   segments[:N]  the candidate sites split into N runs of consecutive sites; each run but the
///                 last is checkpointed as one segment, as checkpoint_sequential does; N defaults
///                 to the square root of the number of candidates (Chen et al. 2016)
///   sites:GLOB[,GLOB]  the candidate sites, and sites nested in them, that match a glob
///   budget:F      (a compiled model, --compile) no module checkpoints: the compiler's activation
///                 memory budget F (0 to 1) decides what its backward recomputes
///   sac:OP[+OP][@GLOB[+GLOB]]  (a Python model under torch.utils.checkpoint) every candidate (or
///                 those a glob matches) checkpointed with an op-level selective policy: the ops
///                 named are saved, every other op recomputed
struct Policy {
  enum class Kind { kNone, kEvery, kSegments, kSites, kBudget, kSac };
  Kind kind = Kind::kEvery;
  int64_t k = 1;  // every:K, or segments:N (0: the square root of the number of candidates)
  std::vector<std::string> globs;  // sites:GLOBS, or the sites a sac: policy checkpoints
  double budget = 1.0;  // budget:F
  std::vector<std::string> ops;  // sac:OPS, as aten.mm or aten.mm.default

  /// Parses a policy; throws UsageError naming the valid forms.
  static Policy parse(const std::string& text);
  std::string text() const;
};

/// Glob match over module paths: '*' matches any run of characters (dots included), '?' one
/// character, and [abc] one of a set.
bool glob_match(const std::string& pattern, const std::string& text);

struct Plan {
  Policy policy;
  /// The outermost sites checkpoints may go to (--sites, or the model's default sites).
  std::vector<std::string> candidates;
  /// What is checkpointed: each unit is one site or, under segments:N, a run of chain sites.
  /// Under budget:F, every candidate: the compiled whole covers them.
  std::vector<std::vector<std::string>> units;

  /// The compiler's activation memory budget under budget:F; nullopt for module checkpoints.
  std::optional<double> compiler_budget() const {
    return policy.kind == Policy::Kind::kBudget ? std::optional<double>(policy.budget) : std::nullopt;
  }

  /// Under sac:OPS, the ops saved, comma-separated (as --sac-save takes them); "" otherwise.
  std::string sac_save() const;

  /// Builds the plan for a model; throws UsageError when a glob matches no site or the policy
  /// does not fit the model.
  static Plan make(const Model& model, const std::vector<std::string>& site_globs,
                   const Policy& policy);

  /// Every site a checkpointed unit covers, in order, the members of a segment included.
  std::vector<std::string> checkpointed() const;
  /// A unit's name: its site, or "first..last" for a segment.
  static std::string unit_label(const std::vector<std::string>& unit);
};

}  // namespace ckcheck
