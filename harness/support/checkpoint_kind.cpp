#include "harness/support/checkpoint_kind.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "harness/support/enum_names.h"
#include "harness/support/errors.h"

namespace ckcheck {
namespace {

constexpr EnumName<CheckpointKind> kNames[] = {
    {CheckpointKind::kAuto, "auto"},       {CheckpointKind::kCkcheck, "ckcheck"},
    {CheckpointKind::kTorch, "torch"},     {CheckpointKind::kTorchReentrant, "torch-reentrant"},
    {CheckpointKind::kTorchSac, "torch-sac"}, {CheckpointKind::kTorchWrapper, "torch-wrapper"},
    {CheckpointKind::kModel, "model"},
    {CheckpointKind::kCompiler, "compiler"},
};

}  // namespace

const char* checkpoint_kind_name(CheckpointKind kind) { return name_in(kNames, kind); }

CheckpointKind parse_checkpoint_kind(const std::string& name) {
  if (const auto kind = parse_in(kNames, name)) return *kind;
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
