// The few numbers a training step needs on the host (its loss, whether its gradients are finite,
// their norm), read from the device in one copy: one synchronisation per step, where a read per
// number (or per gradient) would stall a GPU's queue each time.
//
// The read is the LibTorch profiler scope "engine::read_step_scalars", so traces show it and
// tests can count it. Throws what LibTorch throws.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace engine {

extern const char kReadStepScalarsScope[];

// Each tensor a one-element value (undefined: read as NaN), all on one device; their values in
// f64, in order.
std::vector<double> ReadStepScalars(const std::vector<at::Tensor>& scalars);

}  // namespace engine
