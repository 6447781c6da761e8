#include "tests/support/support.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "ckcheck_test_paths.h"

namespace ckcheck::testing {

std::string tensors_differ(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return a.defined() ? "second is undefined" : "first is undefined";
  if (!a.defined()) return "";
  if (a.sizes() != b.sizes()) {
    return fmt::format("shapes differ: {} vs {}", fmt::join(a.sizes(), "x"), fmt::join(b.sizes(), "x"));
  }
  if (a.scalar_type() != b.scalar_type()) {
    return fmt::format("dtypes differ: {} vs {}", c10::toString(a.scalar_type()),
                       c10::toString(b.scalar_type()));
  }
  auto x = a.detach().cpu(), y = b.detach().cpu();
  auto same = x.eq(y);
  if (x.is_floating_point()) same = same.logical_or(x.isnan().logical_and(y.isnan()));
  if (same.all().item<bool>()) return "";
  auto idx = same.logical_not().flatten().nonzero()[0].item<int64_t>();
  return fmt::format("{} of {} elements differ, first at flat index {}: {} vs {}",
                     same.logical_not().sum().item<int64_t>(), same.numel(), idx,
                     x.flatten()[idx].item<double>(), y.flatten()[idx].item<double>());
}

::testing::AssertionResult AssertTensorsEqual(const char* a_expr, const char* b_expr,
                                              const torch::Tensor& a, const torch::Tensor& b) {
  const auto diff = tensors_differ(a, b);
  if (diff.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << a_expr << " vs " << b_expr << ": " << diff;
}

std::string test_binary_dir() { return CKCHECK_TEST_BINARY_DIR; }

std::string test_source_dir() { return CKCHECK_TEST_SOURCE_DIR; }

namespace {
// The process's own scratch folder, removed with what is in it when the process exits -- by the
// process that made it only, not by a child forked from it.
class ScratchDir {
 public:
  ScratchDir() : owner_(::getpid()), path_(fmt::format("{}/scratch.{}", test_binary_dir(), owner_)) {
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    if (::getpid() == owner_) std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  pid_t owner_;
  std::string path_;
};
}  // namespace

std::string scratch_path(const std::string& suffix) {
  static const ScratchDir dir;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "suite";
  for (auto& c : name) {
    if (c == '/') c = '_';
  }
  return fmt::format("{}/{}.{}", dir.path(), name, suffix);
}

}  // namespace ckcheck::testing
