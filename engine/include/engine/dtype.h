// Names for tensor dtypes, as the engine prints them, as safetensors stores them and as torch
// spells them.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <string_view>

#include "engine/options.pb.h"

namespace engine {

// Short names for plans and messages: "f32", "bf16", "f16", "i64", "bool", ...
std::string_view DtypeShortName(at::ScalarType dtype);
std::optional<at::ScalarType> DtypeFromShortName(std::string_view name);

// The safetensors names: "F32", "BF16", "F16", "I64", "BOOL", ... Unsupported dtypes give nullopt.
std::optional<std::string_view> SafetensorsDtypeName(at::ScalarType dtype);
std::optional<at::ScalarType> DtypeFromSafetensorsName(std::string_view name);

// torch's names, as Hugging Face configs write torch_dtype: "float32", "bfloat16", "float16",
// "float64" (any other dtype gives "float32").
std::string TorchDtypeName(at::ScalarType dtype);

// The scalar type a quantizer's declared compute dtype names.
at::ScalarType ScalarTypeOf(ComputeDtype dtype);

}  // namespace engine
