// Helpers shared by the ckcheck tests.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace ckcheck::testing {

/// Bitwise equality of two tensors, where NaN equals NaN in the same place (as PyTorch's
/// assertEqual treats them). Returns a message describing the first difference, or "" if equal.
std::string tensors_differ(const torch::Tensor& a, const torch::Tensor& b);

/// gtest predicate-formatter behind EXPECT_TENSORS_EQUAL.
::testing::AssertionResult AssertTensorsEqual(const char* a_expr, const char* b_expr,
                                              const torch::Tensor& a, const torch::Tensor& b);

#define EXPECT_TENSORS_EQUAL(a, b) \
  EXPECT_PRED_FORMAT2(::ckcheck::testing::AssertTensorsEqual, a, b)

/// Seeds torch's generators before each test, so a test's random tensors do not depend on the
/// order in which tests run.
class SeededTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(0); }
};

/// Runs `body` and returns the message of the c10::Error it throws ("" if none).
template <typename F>
std::string error_of(F&& body) {
  try {
    body();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

/// Where ckcheck's test data (TorchScript files, op libraries built by the tests) lives.
std::string test_binary_dir();

/// The tests' source folder (golden files).
std::string test_source_dir();

/// A path of its own for the running test in a scratch folder of the process's own (CTest runs
/// tests in parallel processes that must not share files), removed when the process exits:
/// "<dir>/scratch.<pid>/<suite>.<test>.<suffix>".
std::string scratch_path(const std::string& suffix);

}  // namespace ckcheck::testing
