// Hand-built records for unit tests of the checks: the plan of the built-in mlp (every block
// checkpointed) and the records of a plain and a checkpointed step that a test fills in. No model
// runs; a check sees only what the test wrote.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checks/check.h"

namespace ckcheck::testing {

struct HandBuiltRecords {
  HandBuiltRecords();

  std::unique_ptr<Model> model;  // the mlp: its sites and parameter names only
  Plan plan;                     // blocks.0 and blocks.1, each checkpointed
  RunConfig config;
  Tolerance tolerance;
  RunRecords records;

  /// The same tensor in both steps.
  void same(const std::string& name, const std::string& kind, const torch::Tensor& value);
  /// A tensor whose checkpointed value differs from the reference's.
  void differ(const std::string& name, const std::string& kind, const torch::Tensor& reference,
              const torch::Tensor& checkpointed);
  /// A checkpointed call of `site` that was recomputed and reproduced its forward (output equal);
  /// the reference holds until the next call().
  CallEvidence& call(const std::string& site);
  /// What the determinism probe saw for `site`: repeatable unless the test says otherwise; the
  /// reference holds until the next probe().
  UnitProbe& probe(const std::string& site);

  /// Runs the check on these records, the diffs computed as the session computes them; knobs not
  /// given have their declared defaults.
  CheckResult run(const Check& check, const std::map<std::string, double>& knobs = {}) const;
};

/// The causes of a result's findings, in order.
std::vector<Cause> causes_of(const CheckResult& result);

}  // namespace ckcheck::testing
