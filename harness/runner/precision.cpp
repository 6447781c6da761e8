// The float64 rerun: the plain and checkpointed steps again with every floating parameter, state
// tensor and input of the model in float64, so that a difference can be told rounding (it shrinks
// by the ratio of the precisions) or real (it keeps its size).
#include <c10/core/DefaultDtype.h>
#include <fmt/format.h>

#include <set>

#include "harness/runner/runner.h"
#include "harness/support/errors.h"
#include "harness/support/memory.h"
#include "harness/support/phase.h"
#include "harness/support/text.h"

namespace ckcheck {

const PrecisionDiff* PrecisionRerun::find(const std::string& name, const std::string& kind, int64_t step) const {
  for (const auto& d : diffs) {
    if (d.name == name && d.kind == kind && d.step == step) return &d;
  }
  return nullptr;
}

namespace {

// Converts the model's floating parameters and state tensors in place (set_data: the same tensors,
// so every module and autograd leaf sees the new dtype) and makes `dtype` the default, for the
// scope's life; puts each tensor's own storage back as it leaves.
class ComputeIn {
 public:
  ComputeIn(Model& model, c10::ScalarType dtype) : model_(model), default_(c10::get_default_dtype()) {
    torch::NoGradGuard no_grad;
    std::set<const c10::TensorImpl*> seen;
    auto convert = [&](const NamedTensors& tensors) {
      for (const auto& [name, t] : tensors) {
        if (!t.defined() || !t.is_floating_point() || t.scalar_type() == dtype) continue;
        if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
        kept_.emplace_back(t, t.variable_data());
        auto live = t;  // a handle to the same TensorImpl
        live.set_data(t.detach().to(dtype));
      }
    };
    convert(model.named_parameters());
    convert(model.state_tensors());
    c10::set_default_dtype(c10::scalarTypeToTypeMeta(dtype));
    model_.precision_changed(dtype);
    entered_ = true;
  }

  ~ComputeIn() {
    try {
      if (entered_) model_.precision_changed(std::nullopt);
    } catch (...) {  // the rerun's own error, if any, is the one to report
    }
    c10::set_default_dtype(default_);
    torch::NoGradGuard no_grad;
    for (auto& [live, original] : kept_) live.set_data(original);
  }

  ComputeIn(const ComputeIn&) = delete;
  ComputeIn& operator=(const ComputeIn&) = delete;

 private:
  Model& model_;
  caffe2::TypeMeta default_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> kept_;  // live tensor, its own storage
  bool entered_ = false;
};

double largest_magnitude(const torch::Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !t.is_floating_point()) return 0.0;
  return t.detach().abs().max().item<double>();
}

// Every tensor the plain rerun recorded against the checkpointed rerun's, as sizes.
std::vector<PrecisionDiff> differences(const StepRecord& plain, const StepRecord& checkpointed) {
  torch::NoGradGuard no_grad;
  std::vector<PrecisionDiff> out;
  for (const auto& t : plain.tensors) {
    PrecisionDiff d{t.name, t.kind, t.step};
    const auto* other = checkpointed.find(t.name, t.kind, t.step);
    d.present = other && t.value.defined() == other->value.defined() &&
                (!t.value.defined() || t.value.sizes() == other->value.sizes());
    if (d.present && t.value.defined() && t.value.is_floating_point()) {
      d.scale = largest_magnitude(t.value);
      if (t.value.numel() > 0 && !torch::equal(t.value, other->value)) {
        d.max_abs = (t.value.to(torch::kDouble) - other->value.to(torch::kDouble)).abs().max().item<double>();
      }
    }
    out.push_back(d);
  }
  return out;
}

}  // namespace

PrecisionRerun Runner::rerun_in_float64(const Plan& plan) {
  PrecisionRerun rerun;
  const double cpu0 = process_cpu_seconds();
  RunConfig config = config_;
  config.compute_dtype = torch::kDouble;
  config.data_parallel = nullptr;
  config.probe_every_unit = false;
  StepOptions plain;
  plain.evidence = false;
  try {
    model_.restore(start_);
    const ComputeIn in_float64(model_, torch::kDouble);
    StepRecord reference, checkpointed;
    {
      // A runner of its own: its start is the converted state, put back before the conversion ends.
      Runner runner(model_, config);
      reference = runner.run(nullptr, plain, "float64 reference");
      checkpointed = runner.run(&plan, plain, "float64 checkpointed");
    }
    for (const auto* step : {&reference, &checkpointed}) {
      if (is_interruption(std::runtime_error(step->error))) throw Interrupted();
    }
    if (!reference.error.empty() || !checkpointed.error.empty()) {
      rerun.error = fmt::format("the {} step failed in float64: {}", reference.error.empty() ? "checkpointed" : "plain",
                                first_line(reference.error.empty() ? checkpointed.error : reference.error));
    } else {
      rerun.diffs = differences(reference, checkpointed);
    }
  } catch (const std::exception& e) {
    model_.restore(start_);
    rethrow_stops(e);
    rerun.error = fmt::format("the model could not be converted to float64: {}", first_line(e.what()));
  }
  model_.restore(start_);
  rerun.cpu_seconds = process_cpu_seconds() - cpu0;
  return rerun;
}

}  // namespace ckcheck
