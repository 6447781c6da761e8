// Custom-op validation: is an op registered with TORCH_LIBRARY safe to recompute under a
// checkpoint? It must be deterministic, change no input its schema does not mark as mutable, use
// random numbers only as a restored generator replays them, behave the same in the forward
// (no-grad, under autocast) and the recompute (grad mode), and give the same gradient
// checkpointed as plain.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "checks/check.h"

namespace ckcheck {

struct OpValidationOptions {
  std::string library;            // shared library to load ("" when the op is already registered)
  std::string op;                 // "namespace::name" or "namespace::name.overload"
  std::vector<std::vector<int64_t>> shapes;  // one per tensor argument; empty: generated
  c10::ScalarType dtype = c10::kFloat;
  uint64_t seed = 0;
  int cases = 10;                 // generated input cases
};

struct OpValidation {
  std::string op;
  std::string schema;
  bool safe = true;
  std::vector<CheckResult> checks;  // determinism, input-mutation, rng, autocast, gradients
  std::vector<std::string> notes;   // conditions for safety ("uses RNG: keep preserve_rng_state")
  int cases = 0;
};

/// Loads the library, finds the op and judges it; throws UsageError for a library that does not
/// load, an op that is not registered (naming the ops of its namespace), or a schema whose
/// arguments ckcheck cannot generate.
OpValidation validate_op(const OpValidationOptions& options);

/// The causes of the findings, each once, in the order of the checks.
inline std::vector<std::string> validation_causes(const OpValidation& v) {
  std::vector<std::string> causes;
  for (const auto& c : v.checks) {
    for (const auto& f : c.findings) {
      const std::string name = cause_name(f.cause);
      if (std::find(causes.begin(), causes.end(), name) == causes.end()) causes.push_back(name);
    }
  }
  return causes;
}

/// "4x16,4x16" -> {{4,16},{4,16}}; throws UsageError otherwise.
std::vector<std::vector<int64_t>> parse_shapes(const std::string& text);

}  // namespace ckcheck
