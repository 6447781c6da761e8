// RapidCheck generators for ckcheck configurations.
#pragma once

#include <rapidcheck.h>

#include <map>
#include <string>

namespace ckcheck::testing {

/// A clean model configuration: a built-in fixture with options, a policy and a seed.
struct ModelCase {
  std::string model;
  std::map<std::string, std::string> options;
  std::string policy;
  uint64_t seed = 0;
  bool amp = false;
  bool restore_buffers = false;  // convnet needs it to pass `buffers`

  /// The ckcheck command that reproduces this case.
  std::string command(const std::string& extra = "") const;
};

/// Small transformer, mlp and convnet configurations with random depth, width, dropout, batch,
/// policy and seed. `with_amp` lets AMP (bf16) be on in some cases.
rc::Gen<ModelCase> clean_model_case(bool with_amp);

}  // namespace ckcheck::testing

namespace rc {
template <>
struct Arbitrary<ckcheck::testing::ModelCase> {
  static Gen<ckcheck::testing::ModelCase> arbitrary() {
    return ckcheck::testing::clean_model_case(false);
  }
};
}  // namespace rc

std::ostream& operator<<(std::ostream& os, const ckcheck::testing::ModelCase& c);
