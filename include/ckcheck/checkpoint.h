// The one include for LibTorch users of ckcheck's checkpoint: ckcheck::checkpoint,
// ckcheck::checkpoint_sequential, ckcheck::CheckpointOptions, ckcheck::is_recomputing.
#pragma once

#include "harness/checkpoint.h"
