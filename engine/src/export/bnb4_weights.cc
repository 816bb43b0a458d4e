#include "export/bnb4_weights.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "core/module_tensors.h"
#include "engine/dtype.h"
#include "engine/linear.h"
#include "engine_kernels/nf4.h"
#include "engine_kernels/nf4_codebook.h"
#include "export/dense_weights.h"

namespace engine {
namespace {

// The block size the layer's NF4 scales were made with: the smallest power of two whose blocks
// cover the weight with as many blocks as it has scales.
int64_t BlockSize(const QuantizedWeight& weight) {
  const int64_t elements = weight.rows() * weight.cols();
  int64_t blocks = 0;
  for (const auto& [name, tensor] : weight.tensors()) {
    if (name == "weight_absmax" || name == "weight_nested_codes") blocks = tensor.numel();
  }
  int64_t size = 32;
  while (blocks > 0 && size < 4096 && (elements + size - 1) / size > blocks) size *= 2;
  return size;
}

struct Quantized {
  at::Tensor packed;  // u8 [(n+1)/2, 1]
  at::Tensor absmax;  // f32 [blocks]
};

// bitsandbytes' 4-bit quantization of `dense`: per block absmax, each value scaled into [-1, 1]
// and given the code whose interval (between midpoints of the sorted NF4 values) holds it.
Quantized QuantizeLikeBitsandbytes(const at::Tensor& dense, int64_t block_size) {
  const at::Tensor flat = dense.reshape({-1}).to(at::kFloat);
  const int64_t n = flat.numel();
  const int64_t blocks = (n + block_size - 1) / block_size;
  const at::Tensor padded = at::constant_pad_nd(flat, {0, blocks * block_size - n}, 0);
  const at::Tensor absmax = padded.view({blocks, block_size}).abs().amax(1);
  const at::Tensor scaled =
      (padded.view({blocks, block_size}) * (1.0 / absmax.clamp_min(1e-38)).unsqueeze(1))
          .clamp(-1, 1)
          .reshape({-1})
          .narrow(0, 0, n);
  const at::Tensor codebook =
      at::tensor(std::vector<float>(kernels::kNf4Codebook.begin(), kernels::kNf4Codebook.end()));
  const at::Tensor midpoints = (codebook.narrow(0, 0, 15) + codebook.narrow(0, 1, 15)) / 2;
  at::Tensor codes =
      at::bucketize(at::constant_pad_nd(scaled, {0, n % 2}, 0), midpoints).to(at::kByte);
  const at::Tensor high = codes.slice(0, 0, codes.numel(), 2);
  const at::Tensor low = codes.slice(0, 1, codes.numel(), 2);
  return {at::bitwise_or(at::bitwise_left_shift(high, 4), low).unsqueeze(1).contiguous(),
          absmax.contiguous()};
}

// bitsandbytes' double quantization of the f32 scales (quantize_4bit with compress_statistics,
// as its reference backend computes it): the scales less their mean, in blocks of 256, each
// scaled by its largest magnitude into [-1, 1] and given the nearest value of the dynamic map.
struct NestedScales {
  at::Tensor codes;   // u8 [blocks]
  at::Tensor absmax;  // f32 [ceil(blocks / 256)]
  at::Tensor map;     // f32 [256]
  float offset = 0;
};

constexpr int64_t kNestedBlockSize = 256;

// `map`: kernels::Nf4ScaleMap().
NestedScales DoubleQuantize(const at::Tensor& scales, const at::Tensor& map) {
  NestedScales nested;
  const at::Tensor mean = scales.mean();
  nested.offset = mean.item<float>();
  const at::Tensor centred = scales - mean;
  const int64_t n = centred.numel();
  const int64_t rem = n % kNestedBlockSize;
  const int64_t full = n - rem;
  std::vector<at::Tensor> absmax, scaled;
  if (full > 0) {
    const at::Tensor blocks = centred.narrow(0, 0, full).view({-1, kNestedBlockSize});
    absmax.push_back(std::get<0>(blocks.abs().max(-1)));
    scaled.push_back(
        (blocks * (1.0 / absmax.back().clamp_min(1e-38).view({-1, 1}))).clamp(-1, 1).reshape(-1));
  }
  if (rem > 0) {
    const at::Tensor tail = centred.narrow(0, full, rem);
    const at::Tensor largest = tail.abs().max().clamp_min(1e-38);
    absmax.push_back(largest.unsqueeze(0));
    scaled.push_back((tail / largest).clamp(-1, 1));
  }
  nested.map = map;
  const at::Tensor bounds = (nested.map.narrow(0, 0, 255) + nested.map.narrow(0, 1, 255)) / 2;
  nested.codes = at::bucketize(at::cat(scaled), bounds).to(at::kByte).contiguous();
  nested.absmax = at::cat(absmax).contiguous();
  return nested;
}

// quant_state.bitsandbytes__nf4: the JSON of the state's non-tensor items, as bytes.
at::Tensor PackedQuantState(int64_t block_size, at::ScalarType dtype, int64_t rows, int64_t cols,
                            const NestedScales* nested) {
  nlohmann::ordered_json state = {{"quant_type", "nf4"},
                                  {"blocksize", block_size},
                                  {"dtype", TorchDtypeName(dtype)},
                                  {"shape", {rows, cols}}};
  if (nested != nullptr) {
    state["nested_blocksize"] = kNestedBlockSize;
    state["nested_dtype"] = "float32";
    state["nested_offset"] = static_cast<double>(nested->offset);
  }
  const std::string text = state.dump(-1, ' ', false);
  // json.dumps' separators: ", " and ": ".
  std::string spaced;
  bool in_string = false;
  for (char c : text) {
    spaced += c;
    if (c == '"') in_string = !in_string;
    if (!in_string && (c == ',' || c == ':')) spaced += ' ';
  }
  at::Tensor bytes = at::empty({static_cast<int64_t>(spaced.size())}, at::kByte);
  std::copy(spaced.begin(), spaced.end(), bytes.data_ptr<uint8_t>());
  return bytes;
}

}  // namespace

StatusOr<Bnb4Export> Bnb4Weights(torch::nn::Module& module, at::ScalarType dtype,
                                 bool double_quant) {
  at::NoGradGuard no_grad;
  Bnb4Export out;
  std::map<std::string, std::shared_ptr<LinearImpl>> quantized;
  std::set<std::string> dropped;
  for (const auto& [name, layer] : NamedLinears(module)) {
    if (layer->quantized() == nullptr) {
      out.dense_linears.push_back(name);
    } else if (layer->quantized()->format() != "nf4") {
      return FailedPreconditionError("layer '" + name + "' is quantized as " +
                                     layer->quantized()->format() +
                                     "; bitsandbytes' 4-bit format holds NF4 layers");
    } else {
      quantized[name + ".weight"] = layer;
      for (const auto& [tensor, value] : layer->quantized()->tensors()) {
        dropped.insert(name + "." + tensor);
      }
    }
    for (const std::string& tensor : layer->AdapterTensorNames())
      dropped.insert(name + "." + tensor);
  }
  if (quantized.empty()) {
    return FailedPreconditionError(
        "the model has no NF4 layer: a bnb4 export holds a 4-bit base (use --format=hf)");
  }
  const at::Tensor dynamic_map = double_quant ? kernels::Nf4ScaleMap() : at::Tensor();
  for (const ModuleTensor& t : ModuleTensors(module)) {
    if (auto layer = quantized.find(t.name); layer != quantized.end()) {
      const QuantizedWeight& weight = *layer->second->quantized();
      const int64_t block_size = BlockSize(weight);
      const Quantized q = QuantizeLikeBitsandbytes(
          weight.DequantizeRows(0, weight.rows(), at::kFloat).cpu(), block_size);
      out.tensors.emplace_back(t.name, q.packed);
      std::optional<NestedScales> nested;
      if (double_quant) nested = DoubleQuantize(q.absmax, dynamic_map);
      out.tensors.emplace_back(t.name + ".absmax", nested ? nested->codes : q.absmax);
      out.tensors.emplace_back(t.name + ".quant_map",
                               at::tensor(std::vector<float>(kernels::kNf4Codebook.begin(),
                                                             kernels::kNf4Codebook.end())));
      if (nested) {
        out.tensors.emplace_back(t.name + ".nested_absmax", nested->absmax);
        out.tensors.emplace_back(t.name + ".nested_quant_map", nested->map);
      }
      out.tensors.emplace_back(t.name + ".quant_state.bitsandbytes__nf4",
                               PackedQuantState(block_size, dtype, weight.rows(), weight.cols(),
                                                nested ? &*nested : nullptr));
      out.compute_dtype = TorchDtypeName(layer->second->quantized_compute_dtype());
    } else if (!dropped.count(t.name)) {
      out.tensors.emplace_back(t.name, ExportedTensor(t.tensor, dtype));
    }
  }
  return out;
}

}  // namespace engine
