// A trained model's weights as a plain dense model holds them, for `engine export --format hf`:
// each engine::Linear's weight with its adapters merged in (LinearImpl::MergedWeight: W + the
// adapters' WeightDelta, a 4-bit base dequantized first), no adapter parameters, no quantized codes
// or scales, floating-point tensors in `dtype`. The merge is computed in f32 and cast once. The
// model is not changed.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "engine/safetensors.h"
#include "engine/status.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace engine {

// `tensor` as an export writes it: on the CPU, contiguous, in `dtype` when it is floating-point.
at::Tensor ExportedTensor(const at::Tensor& tensor, at::ScalarType dtype);

// In the order of the module's tensors (core/module_tensors.h).
StatusOr<safetensors::NamedTensors> DenseWeights(torch::nn::Module& module, at::ScalarType dtype);

}  // namespace engine
