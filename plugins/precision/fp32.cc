// The `fp32` precision policy: everything stored, computed, differentiated and updated in f32.
// Tensors loaded in another floating dtype are cast to f32; the plan says how many.
#include "standard_policy.h"

ENGINE_STANDARD_PRECISION_POLICY(
    "fp32", Fp32Policy, "everything in f32: storage, compute, gradients, masters, optimizer state")
