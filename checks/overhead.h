// The overhead check's knob, which `ckcheck bench` uses as its line between an acceptable and a
// too-fine policy: one bound, declared once.
#pragma once

#include "checks/check.h"

namespace ckcheck {

/// --max-overhead: the most step time checkpointing may add (0.5 = +50%).
const CheckKnob& max_overhead_knob();

}  // namespace ckcheck
