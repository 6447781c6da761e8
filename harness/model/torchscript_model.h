// TorchScript files as Models: the submodule calls of the scripted (or traced) module become
// checkpoint sites.
//
// Loading rewrites every `prim::CallMethod` to a submodule's forward into a call of the operator
// `ckcheck::site_call`, which looks the submodule up by identity, finds its module path, and
// hands the call to the current SiteRunner -- plainly or under ckcheck::checkpoint, as the plan
// says. Outer matches win over nested ones because a site inside a checkpointed one runs plainly.
#pragma once

#include <memory>
#include <string>

#include "ckcheck/model.h"
#include "harness/model/random_input.h"

namespace ckcheck {

/// How the inputs of a TorchScript model are made.
struct TorchScriptInputs {
  RandomInput random;  // one seeded random tensor, when given
  std::string file;    // tensors saved from Python with torch.save (tensor, list or tuple)
  /// Training flags: "as-saved" (each module's flag as exported), "train" or "eval" (all modules).
  std::string mode = "as-saved";
};

/// Loads a TorchScript file; throws UsageError for a missing or corrupt file or bad input
/// options.
std::unique_ptr<Model> load_torchscript_model(const std::string& path, const TorchScriptInputs& inputs,
                                              uint64_t seed);

/// Makes the ckcheck::site_call operator known to the TorchScript interpreter (idempotent).
void register_torchscript_ops();

}  // namespace ckcheck
