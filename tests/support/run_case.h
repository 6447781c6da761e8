// Running a model configuration through the Runner and the checks, as `ckcheck run` does, for
// tests that look at check results.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "analyses/session.h"
#include "tests/support/generators.h"

namespace ckcheck::testing {

struct CaseResult {
  std::vector<CheckResult> results;
  RunRecords records;
  size_t units = 0;  // checkpointed units of the plan
  const CheckResult& check(const std::string& id) const;
  /// "gradients=pass rng=fail(rng@blocks.1) ..." for failure messages.
  std::string summary() const;
};

/// Runs every built-in check on the case, with optional tweaks of the run configuration.
CaseResult run_case(const ModelCase& c, const std::vector<std::string>& flags = {});

}  // namespace ckcheck::testing
