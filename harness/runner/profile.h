// What each checkpoint site of a plain training step costs and keeps, measured once: the memory a
// checkpoint at that site would free, the forward a checkpoint would run again, and where in the
// step memory peaks. `ckcheck plan` predicts any plan's peak and time from it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/runner/runner.h"

namespace ckcheck {

/// One candidate site of the plain step.
struct SiteCost {
  std::string site;
  int64_t input_bytes = 0;   // its inputs: what a checkpoint keeps in their place
  int64_t output_bytes = 0;  // its outputs, made afresh by its forward
  /// What its forward leaves allocated beyond its outputs (the activations saved for its
  /// backward): what a checkpoint at the site frees until the site's backward.
  int64_t kept_bytes = 0;
  int64_t forward_peak_bytes = 0;  // most bytes its forward had allocated above its start
  double forward_seconds = 0.0;    // its forward (median over the measured steps)
  /// Measured in a step with every candidate checkpointed, against the plain step: what its
  /// backward holds beyond the plain backward's peak there (the recomputed outputs, gradients the
  /// checkpoint hands back rather than accumulates, ...).
  int64_t recompute_extra_bytes = 0;
  /// What a checkpoint at the site adds in time: its recompute, the site's forward again.
  double recompute_seconds = 0.0;
};

/// A stretch of the plain step and the most memory above the step's start it reached. While it
/// runs, the sites [0, holding) hold what they keep for backward (the memory a checkpoint at one
/// of them frees there); in a site's backward, a checkpoint there first runs the site's forward
/// again (`recomputes`).
struct PeakRegion {
  std::string where;  // "forward of blocks.3", "after blocks.3", "backward of blocks.3", "before the sites"
  int64_t peak_bytes = 0;
  double seconds = 0.0;  // how long it lasted
  size_t holding = 0;
  std::optional<size_t> recomputes;
};

/// An op class a selective checkpoint (sac:OPS) can save, as the plain step's forward runs it
/// inside the candidate sites: the ops autograd sees (a CompositeImplicitAutograd op counts as the
/// ops it calls), neither views, in-place ops nor ops that make a tensor from no activation (empty,
/// zeros_like, arange, ...).
struct OpClassCost {
  std::string op;                    // "aten.mm": every overload, as sac:OPS names it
  int64_t calls = 0;                 // per step, over the sites
  std::vector<int64_t> site_bytes;   // per site: its outputs, what saving it keeps until the site's backward
  std::vector<double> site_seconds;  // per site: its time, what saving it spares the site's recompute
  int64_t bytes() const;
  double seconds() const;
};

struct StepProfile {
  std::vector<SiteCost> sites;      // in the order the forward reaches them
  std::vector<PeakRegion> regions;  // in the order the step runs through them
  int64_t baseline_bytes = 0;       // parameters, gradients and inputs
  int64_t peak_bytes = 0;           // the plain step's most bytes above the baseline
  double step_seconds = 0.0;        // the plain step (median)
  int64_t steps = 0;                // measured steps
  /// Sites whose checkpoint could not be measured (the step threw there): their figures are
  /// estimated from the plain step (a checkpoint frees what the forward keeps, adds its outputs in
  /// the backward and its forward in time). Why, in `calibration_note`.
  std::vector<std::string> uncalibrated;
  std::string calibration_note;
  std::string error;                // what stopped the profile ("" when it ran)
  /// The op classes a sac:OPS plan can save, most time first; empty when the checkpoint under test
  /// takes no op-level policy (why, in `op_classes_note`).
  std::vector<OpClassCost> op_classes;
  std::string op_classes_note;
};

/// Runs `warmup` then `steps` plain training steps through `runner`, watching the outermost of
/// `sites`: memory at every site's entry and exit and at the start of its backward (a hook on its
/// outputs' gradients), each stretch's peak and duration, each site's forward time. Then as many
/// steps with every one of `sites` checkpointed by the checkpoint under test, watched alike: what
/// a checkpoint at each site frees (the plain step's activations there less what the checkpointed
/// forward keeps), adds in the site's backward and costs in time.
StepProfile profile_sites(Runner& runner, const std::vector<std::string>& sites, int64_t warmup, int64_t steps);

/// `warmup` untraced then `steps` plain steps with every op traced: each op class's outputs and time
/// inside each of `sites` (the outermost sites, in profile.sites' order). Times are scaled so that
/// within a site they add up to at most its forward's time untraced (the tracer's own cost aside).
/// Fills profile.op_classes; `error` when the traced step threw.
void profile_op_classes(Runner& runner, StepProfile& profile, int64_t warmup, int64_t steps);

}  // namespace ckcheck
