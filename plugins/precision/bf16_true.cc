// The `bf16-true` precision policy: weights stored and computed in bf16; every trainable weight
// keeps an f32 master and f32 optimizer state (unless unsafe_low_precision_updates).
#include "standard_policy.h"

ENGINE_STANDARD_PRECISION_POLICY("bf16-true", Bf16TruePolicy,
                                 "bf16 weights and compute, f32 masters and optimizer state")
