#include "harness/support/checkpoint_kind.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "harness/support/errors.h"

namespace ckcheck {
namespace {

constexpr std::pair<CheckpointKind, const char*> kNames[] = {
    {CheckpointKind::kAuto, "auto"},       {CheckpointKind::kCkcheck, "ckcheck"},
    {CheckpointKind::kTorch, "torch"},     {CheckpointKind::kTorchReentrant, "torch-reentrant"},
    {CheckpointKind::kTorchSac, "torch-sac"}, {CheckpointKind::kTorchWrapper, "torch-wrapper"},
    {CheckpointKind::kModel, "model"},
    {CheckpointKind::kCompiler, "compiler"},
};

}  // namespace

const char* checkpoint_kind_name(CheckpointKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return name;
  }
  return "?";
}

CheckpointKind parse_checkpoint_kind(const std::string& name) {
  for (const auto& [k, n] : kNames) {
    if (name == n) return k;
  }
  throw UsageError(fmt::format("unknown checkpoint '{}'; checkpoints: {}", name, fmt::join(checkpoint_option_names(), ", ")));
}

std::vector<std::string> checkpoint_option_names() {
  std::vector<std::string> out;
  for (const auto& [k, name] : kNames) {
    if (k != CheckpointKind::kCompiler) out.push_back(name);
  }
  return out;
}

}  // namespace ckcheck
