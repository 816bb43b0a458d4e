// Reading the 4-bit layers of a checkpoint that transformers + bitsandbytes saved pre-quantized
// (config.json's `quantization_config`: bitsandbytes, load_in_4bit, NF4): each such layer's weight
// is stored as bitsandbytes' Params4bit state, X.weight (u8, two codes per byte, the first in the
// high nibble), X.weight.absmax (f32 per block of `blocksize`; or, double-quantized, u8 codes into
// X.weight.nested_quant_map scaled by X.weight.nested_absmax per 256 blocks plus nested_offset),
// X.weight.quant_map and X.weight.quant_state.bitsandbytes__nf4 (the JSON of quant_type,
// blocksize, dtype, shape and the nested fields).
//
// The layer is read back as the dense weight bitsandbytes dequantizes it to (its NF4 table, in
// f32, then the state's dtype), so the model computes what transformers computes with it; a
// stage's nf4 quantizer at the same block size, without double quantization, then makes the same
// codes and scales again. The files are untrusted: the state is read up to 64 KiB, and every size
// in it is checked against the tensors; errors name the tensor and both values. Pure functions;
// any thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

#include "engine/status.h"

namespace engine::transformer {

// The tensor beside a 4-bit weight that holds its state.
inline constexpr char kBnb4StateSuffix[] = ".quant_state.bitsandbytes__nf4";

// Whether the checkpoint tensor `name` comes with a 4-bit weight (its scales, maps or state), given
// whether the checkpoint holds a tensor (`has`).
bool IsBnb4Companion(const std::string& name, const std::function<bool(const std::string&)>& has);

// The dense weight bitsandbytes dequantizes the 4-bit weight `weight` to, which must have `shape`.
// `get` reads a checkpoint tensor; `where` (the directory) begins every error.
StatusOr<at::Tensor> DequantizeBnb4(
    const std::string& weight, at::IntArrayRef shape,
    const std::function<StatusOr<at::Tensor>(const std::string&)>& get, const std::string& where);

}  // namespace engine::transformer
