#include "engine/dtype.h"

#include <array>
#include <utility>

namespace engine {
namespace {

struct DtypeNames {
  at::ScalarType dtype;
  std::string_view short_name;
  std::string_view safetensors_name;  // empty: not representable in safetensors here
};

constexpr std::array<DtypeNames, 12> kDtypes = {{
    {at::kDouble, "f64", "F64"},
    {at::kFloat, "f32", "F32"},
    {at::kHalf, "f16", "F16"},
    {at::kBFloat16, "bf16", "BF16"},
    {at::kLong, "i64", "I64"},
    {at::kInt, "i32", "I32"},
    {at::kShort, "i16", "I16"},
    {at::kChar, "i8", "I8"},
    {at::kByte, "u8", "U8"},
    {at::kBool, "bool", "BOOL"},
    {at::kComplexFloat, "c64", ""},
    {at::kComplexDouble, "c128", ""},
}};

}  // namespace

std::string_view DtypeShortName(at::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.short_name;
  }
  return c10::toString(dtype);
}

std::optional<at::ScalarType> DtypeFromShortName(std::string_view name) {
  for (const auto& d : kDtypes) {
    if (d.short_name == name) return d.dtype;
  }
  return std::nullopt;
}

std::optional<std::string_view> SafetensorsDtypeName(at::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype && !d.safetensors_name.empty()) return d.safetensors_name;
  }
  return std::nullopt;
}

std::optional<at::ScalarType> DtypeFromSafetensorsName(std::string_view name) {
  for (const auto& d : kDtypes) {
    if (!d.safetensors_name.empty() && d.safetensors_name == name) return d.dtype;
  }
  return std::nullopt;
}

at::ScalarType ScalarTypeOf(ComputeDtype dtype) {
  switch (dtype) {
    case FP16:
      return at::kHalf;
    case FP32:
      return at::kFloat;
    case BF16:
      break;
  }
  return at::kBFloat16;
}

std::string TorchDtypeName(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kDouble:
      return "float64";
    default:
      return "float32";
  }
}

}  // namespace engine
