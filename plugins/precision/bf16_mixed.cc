// The `bf16-mixed` precision policy: f32 storage, masters and optimizer state; matrix products
// under bf16 autocast. No loss scaling (bf16 has f32's range).
#include "standard_policy.h"

ENGINE_STANDARD_PRECISION_POLICY("bf16-mixed", Bf16MixedPolicy,
                                 "f32 weights and optimizer, bf16 autocast for compute")
