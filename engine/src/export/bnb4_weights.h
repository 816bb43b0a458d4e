// A model whose linear layers are NF4-quantized, in bitsandbytes' serialization, for
// `engine export --format bnb4`: what transformers + bitsandbytes load as a pre-quantized 4-bit
// checkpoint (`quantization_config` with load_in_4bit).
//
// Each NF4 layer X becomes bitsandbytes' Params4bit state: X.weight (u8 [(n+1)/2, 1], two codes
// per byte, the first in the high nibble), X.weight.absmax (f32, one per block),
// X.weight.quant_map (the 16 NF4 values) and X.weight.quant_state.bitsandbytes__nf4 (u8: the JSON
// of quant_type, blocksize, dtype and shape). The codes are made as bitsandbytes makes them from
// the layer's dequantized weight at the layer's own block size, which gives back the layer's codes
// and scales, so bitsandbytes dequantizes to the engine's weights exactly. The scales are stored
// in f32; with `double_quant` they are double-quantized as bitsandbytes' compress_statistics does
// (X.weight.absmax u8 codes of the scales less their mean, in blocks of 256, in its dynamic 8-bit
// map, X.weight.nested_absmax f32, X.weight.nested_quant_map, and nested_blocksize, nested_dtype
// and nested_offset in the state's JSON): a quarter of the scales' bytes, each scale then within
// about 1% of the block's largest deviation from the mean, so the weights are no longer exactly
// the engine's. Other
// floating-point tensors are written in `dtype`; adapters are not included (export them with
// --format=peft). The model is not changed.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

#include "engine/safetensors.h"
#include "engine/status.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace engine {

struct Bnb4Export {
  safetensors::NamedTensors tensors;
  std::vector<std::string> dense_linears;  // full names of the linear layers left unquantized
  std::string compute_dtype;               // "bfloat16": the NF4 layers' declared compute dtype
};

// Fails when no layer is NF4 (nothing to export in this format) or a layer is quantized in
// another format.
StatusOr<Bnb4Export> Bnb4Weights(torch::nn::Module& module, at::ScalarType dtype,
                                 bool double_quant = false);

}  // namespace engine
