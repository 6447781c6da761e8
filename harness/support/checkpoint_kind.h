// The checkpoint under test, as a kind: what --checkpoint and ckcheck.run(checkpoint=) name, and
// what `auto` resolves to. Names are parsed and printed here only; everything else compares kinds.
#pragma once

#include <string>
#include <vector>

namespace ckcheck {

enum class CheckpointKind {
  kAuto,            // resolved by the model: its own switch, else torch (Python); ckcheck (C++, TorchScript)
  kCkcheck,         // ckcheck::checkpoint
  kTorch,           // torch.utils.checkpoint, use_reentrant=False
  kTorchReentrant,  // torch.utils.checkpoint, use_reentrant=True
  kTorchSac,        // non-reentrant with an op-level policy (selective activation checkpointing)
  kTorchWrapper,    // PyTorch's checkpoint_wrapper around each unit, as apply_activation_checkpointing applies it
  kModel,           // the model's own switch (gradient_checkpointing_enable() and its kind)
  kCompiler,        // no module checkpoints: the compiler's recompute under --compile --memory-budget
};

/// Its name: auto, ckcheck, torch, torch-reentrant, torch-sac, model, compiler.
const char* checkpoint_kind_name(CheckpointKind kind);
/// The kind a name gives; throws UsageError naming the kinds for any other.
CheckpointKind parse_checkpoint_kind(const std::string& name);
/// The names --checkpoint takes (every kind but compiler, which a run resolves to).
std::vector<std::string> checkpoint_option_names();

}  // namespace ckcheck
