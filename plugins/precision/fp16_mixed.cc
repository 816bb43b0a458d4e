// The `fp16-mixed` precision policy: f32 storage, masters and optimizer state; matrix products
// under fp16 autocast; dynamic loss scaling, skipping overflowed steps.
#include "standard_policy.h"

ENGINE_STANDARD_PRECISION_POLICY(
    "fp16-mixed", Fp16MixedPolicy,
    "f32 weights and optimizer, fp16 autocast for compute, dynamic loss scaling")
