// The `fp16-true` precision policy: weights stored and computed in fp16; f32 masters and optimizer
// state for what trains; dynamic loss scaling (unless unsafe_low_precision_updates, which drops
// both).
#include "standard_policy.h"

ENGINE_STANDARD_PRECISION_POLICY(
    "fp16-true", Fp16TruePolicy,
    "fp16 weights and compute, f32 masters and optimizer state, dynamic loss scaling")
