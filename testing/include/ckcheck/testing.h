// GoogleTest assertions for your own suites (#include <ckcheck/testing.h>): does checkpointing
// change anything for this model?
//
//   #include <ckcheck/testing.h>
//
//   TEST(MyModel, CheckpointingIsExact) {
//     MyCkcheckModel model;   // a ckcheck::Model, e.g. from ckcheck::module_model(...)
//     EXPECT_CHECKPOINT_EQUIVALENT(model, inputs, ckcheck::EquivalenceOptions().policy("every:1"));
//   }
//
// A failure prints the same findings `ckcheck run` prints, with the command that reproduces it.
#pragma once

#include <gtest/gtest.h>
#include <torch/arg.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckcheck/model.h"

namespace ckcheck {

/// What EXPECT_CHECKPOINT_EQUIVALENT runs, in the style of CheckpointOptions.
struct EquivalenceOptions {
  /// The checkpoint policy: none, every:K, segments[:N], sites:GLOB. Default: "every:1".
  TORCH_ARG(std::string, policy) = "every:1";
  /// Globs of the sites checkpoints may go to. Default: the model's default sites.
  TORCH_ARG(std::vector<std::string>, sites) = {};
  /// bitwise, rtol=R,atol=A or ulp=N. Default: "bitwise".
  TORCH_ARG(std::string, tolerance) = "bitwise";
  /// Training steps compared. Default: 1.
  TORCH_ARG(int64_t, steps) = 1;
  /// Seed of the RNG and the upstream gradient. Default: 0.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Check ids to run (ckcheck list). Default: all that run by default.
  TORCH_ARG(std::vector<std::string>, checks) = {};
  /// Restore each checkpointed site's buffers after its recompute. Default: false.
  TORCH_ARG(bool, restore_buffers) = false;
};

/// A Model from a torch::nn::Module and a forward that calls its sites through the SiteRunner:
///
///   auto model = ckcheck::module_model("net", net, {"blocks.0", "blocks.1"},
///       [&](const std::vector<torch::Tensor>& x, ckcheck::SiteRunner& sites) {
///         auto h = sites.call("blocks.0", [&](const torch::Tensor& t) { return net->b0(t); }, x[0]);
///         return std::vector<torch::Tensor>{sites.call("blocks.1", ..., h)};
///       });
using ModuleForward =
    std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&, SiteRunner&)>;
std::unique_ptr<Model> module_model(const std::string& name, std::shared_ptr<torch::nn::Module> module,
                                    std::vector<std::string> sites, ModuleForward forward);

namespace testing {

/// gtest predicate-formatter behind the macros.
::testing::AssertionResult AssertCheckpointEquivalent(const char* model_expr, const char* inputs_expr,
                                                      const char* options_expr, Model& model,
                                                      const std::vector<torch::Tensor>& inputs,
                                                      const EquivalenceOptions& options);

}  // namespace testing
}  // namespace ckcheck

/// Checkpointing `model` as `options` say gives the same loss, outputs, gradients and buffers
/// as not checkpointing it, on `inputs` (a std::vector<torch::Tensor>).
#define EXPECT_CHECKPOINT_EQUIVALENT(model, inputs, options) \
  EXPECT_PRED_FORMAT3(::ckcheck::testing::AssertCheckpointEquivalent, model, inputs, options)
#define ASSERT_CHECKPOINT_EQUIVALENT(model, inputs, options) \
  ASSERT_PRED_FORMAT3(::ckcheck::testing::AssertCheckpointEquivalent, model, inputs, options)
