#include "bnb4_checkpoint.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "engine/dtype.h"
#include "engine_kernels/nf4_codebook.h"

namespace engine::transformer {
namespace {

constexpr int64_t kMaxStateBytes = 64 << 10;
const char* const kCompanions[] = {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                                   kBnb4StateSuffix};

std::string ShapeText(at::IntArrayRef sizes) { return c10::str(sizes); }

// The state's JSON; an error naming the tensor when it is not one.
StatusOr<nlohmann::json> ReadState(const std::string& name, const at::Tensor& bytes,
                                   const std::string& where) {
  if (bytes.scalar_type() != at::kByte || bytes.dim() != 1 || bytes.numel() > kMaxStateBytes) {
    return InvalidArgumentError(where + ": tensor '" + name +
                                "' must be the bytes of bitsandbytes' quant_state JSON (u8, at "
                                "most 64 KiB), not " +
                                std::string(DtypeShortName(bytes.scalar_type())) + " " +
                                ShapeText(bytes.sizes()));
  }
  const at::Tensor contiguous = bytes.contiguous();
  const std::string text(reinterpret_cast<const char*>(contiguous.data_ptr<uint8_t>()),
                         static_cast<size_t>(contiguous.numel()));
  nlohmann::json state = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!state.is_object()) {
    return InvalidArgumentError(where + ": tensor '" + name + "' is not a JSON object");
  }
  return state;
}

// A floating-point tensor of `numel` elements, as f32; else an error naming it.
StatusOr<at::Tensor> FloatsOf(const std::function<StatusOr<at::Tensor>(const std::string&)>& get,
                              const std::string& name, int64_t numel, const std::string& why,
                              const std::string& where) {
  ENGINE_ASSIGN_OR_RETURN(at::Tensor t, get(name).WithContext(where));
  if (!at::isFloatingType(t.scalar_type()) || t.numel() != numel) {
    return InvalidArgumentError(where + ": tensor '" + name + "' is " +
                                std::string(DtypeShortName(t.scalar_type())) + " " +
                                ShapeText(t.sizes()) + ", but " + why + " needs " +
                                std::to_string(numel) + " floating-point values");
  }
  return t.to(at::kFloat).reshape({numel});
}

}  // namespace

bool IsBnb4Companion(const std::string& name, const std::function<bool(const std::string&)>& has) {
  for (const char* suffix : kCompanions) {
    const std::string tail = suffix;
    if (name.size() > tail.size() &&
        name.compare(name.size() - tail.size(), tail.size(), tail) == 0 &&
        has(name.substr(0, name.size() - tail.size()) + kBnb4StateSuffix)) {
      return true;
    }
  }
  return false;
}

StatusOr<at::Tensor> DequantizeBnb4(
    const std::string& weight, at::IntArrayRef shape,
    const std::function<StatusOr<at::Tensor>(const std::string&)>& get, const std::string& where) {
  const std::string state_name = weight + kBnb4StateSuffix;
  ENGINE_ASSIGN_OR_RETURN(const at::Tensor state_bytes, get(state_name).WithContext(where));
  ENGINE_ASSIGN_OR_RETURN(const nlohmann::json state, ReadState(state_name, state_bytes, where));
  const auto bad = [&](const std::string& what) {
    return InvalidArgumentError(where + ": tensor '" + state_name + "' " + what);
  };
  // Fields of the wrong JSON type read as absent (null), never as an exception.
  const auto field = [&state](const char* key) {
    auto it = state.find(key);
    return it == state.end() ? nlohmann::json() : *it;
  };
  if (field("quant_type") != "nf4") {
    return bad("has quant_type " + field("quant_type").dump() +
               "; only bitsandbytes' NF4 4-bit layers are read");
  }
  const nlohmann::json blocksize_json = field("blocksize");
  if (!blocksize_json.is_number_integer() || blocksize_json.get<int64_t>() < 16 ||
      blocksize_json.get<int64_t>() > 4096) {
    return bad("has blocksize " + blocksize_json.dump() + "; bitsandbytes' are 16 to 4096");
  }
  const int64_t blocksize = blocksize_json.get<int64_t>();
  const nlohmann::json shape_json = field("shape");
  std::vector<int64_t> stated;
  if (shape_json.is_array()) {
    for (const nlohmann::json& d : shape_json) {
      if (!d.is_number_integer() || d.get<int64_t>() <= 0) break;
      stated.push_back(d.get<int64_t>());
    }
  }
  if (!shape_json.is_array() || stated.size() != shape_json.size() ||
      at::IntArrayRef(stated) != shape) {
    return bad("has shape " + shape_json.dump() + ", but the model's weight is " +
               ShapeText(shape));
  }
  const nlohmann::json dtype_json = field("dtype");
  const std::string dtype_name =
      dtype_json.is_string() ? dtype_json.get<std::string>() : dtype_json.dump();
  const std::optional<at::ScalarType> dtype = dtype_name == "float32"    ? at::kFloat
                                              : dtype_name == "bfloat16" ? at::kBFloat16
                                              : dtype_name == "float16"
                                                  ? at::kHalf
                                                  : std::optional<at::ScalarType>();
  if (!dtype) return bad("has dtype \"" + dtype_name + "\"; float32, bfloat16 or float16 expected");

  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  ENGINE_ASSIGN_OR_RETURN(const at::Tensor codes, get(weight).WithContext(where));
  if (codes.scalar_type() != at::kByte || codes.numel() != (n + 1) / 2) {
    return InvalidArgumentError(
        where + ": tensor '" + weight + "' is " + std::string(DtypeShortName(codes.scalar_type())) +
        " " + ShapeText(codes.sizes()) + ", but its quant_state's shape " + ShapeText(shape) +
        " needs " + std::to_string((n + 1) / 2) + " bytes of two 4-bit codes");
  }
  ENGINE_ASSIGN_OR_RETURN(const at::Tensor quant_map,
                          FloatsOf(get, weight + ".quant_map", 16, "NF4", where));
  const at::Tensor table =
      at::tensor(std::vector<float>(kernels::kNf4Codebook.begin(), kernels::kNf4Codebook.end()));
  if (!at::equal(quant_map, table)) {
    return InvalidArgumentError(where + ": tensor '" + weight +
                                ".quant_map' is not bitsandbytes' NF4 table, which its "
                                "quant_state's quant_type says the codes index");
  }
  at::Tensor absmax;
  if (state.contains("nested_blocksize")) {
    const nlohmann::json nested_json = field("nested_blocksize");
    const nlohmann::json offset = field("nested_offset");
    if (!nested_json.is_number_integer() || nested_json.get<int64_t>() < 1 ||
        nested_json.get<int64_t>() > 4096 || !offset.is_number()) {
      return bad("has nested_blocksize " + nested_json.dump() + " and nested_offset " +
                 offset.dump() + "; a block size of 1 to 4096 and a number expected");
    }
    const int64_t nested_blocksize = nested_json.get<int64_t>();
    ENGINE_ASSIGN_OR_RETURN(const at::Tensor absmax_codes,
                            get(weight + ".absmax").WithContext(where));
    if (absmax_codes.scalar_type() != at::kByte || absmax_codes.numel() != blocks) {
      return InvalidArgumentError(where + ": tensor '" + weight + ".absmax' is " +
                                  std::string(DtypeShortName(absmax_codes.scalar_type())) + " " +
                                  ShapeText(absmax_codes.sizes()) + ", but " +
                                  std::to_string(blocks) +
                                  " blocks double-quantized need as many 8-bit codes");
    }
    ENGINE_ASSIGN_OR_RETURN(const at::Tensor nested_map,
                            FloatsOf(get, weight + ".nested_quant_map", 256,
                                     "the 8-bit map of the double-quantized scales", where));
    const int64_t nested_blocks = (blocks + nested_blocksize - 1) / nested_blocksize;
    ENGINE_ASSIGN_OR_RETURN(const at::Tensor nested_absmax,
                            FloatsOf(get, weight + ".nested_absmax", nested_blocks,
                                     std::to_string(blocks) + " scales in blocks of " +
                                         std::to_string(nested_blocksize),
                                     where));
    absmax = nested_map.index_select(0, absmax_codes.reshape({blocks}).to(at::kLong)) *
                 nested_absmax.repeat_interleave(nested_blocksize).narrow(0, 0, blocks) +
             static_cast<float>(offset.get<double>());
  } else {
    ENGINE_ASSIGN_OR_RETURN(
        absmax,
        FloatsOf(get, weight + ".absmax", blocks,
                 std::to_string(blocks) + " blocks of " + std::to_string(blocksize), where));
  }
  const at::Tensor bytes = codes.reshape({-1});
  const at::Tensor indices =
      at::stack({at::bitwise_right_shift(bytes, 4), at::bitwise_and(bytes, 15)}, 1)
          .reshape({-1})
          .narrow(0, 0, n)
          .to(at::kLong);
  const at::Tensor values = table.index_select(0, indices);
  const at::Tensor scales = absmax.repeat_interleave(blocksize).narrow(0, 0, n);
  return (values * scales).reshape(shape).to(*dtype);
}

}  // namespace engine::transformer
