#include "export/bnb4_weights.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/dtype.h"
#include "engine/linear.h"
#include "engine/module_tensors.h"
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
    if (name == "weight_absmax" || name == "weight_absmax_codes") blocks = tensor.numel();
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

// quant_state.bitsandbytes__nf4: the JSON of the state's non-tensor items, as bytes.
at::Tensor PackedQuantState(int64_t block_size, at::ScalarType dtype, int64_t rows, int64_t cols) {
  nlohmann::ordered_json state = {{"quant_type", "nf4"},
                                  {"blocksize", block_size},
                                  {"dtype", TorchDtypeName(dtype)},
                                  {"shape", {rows, cols}}};
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

StatusOr<Bnb4Export> Bnb4Weights(torch::nn::Module& module, at::ScalarType dtype) {
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
  for (const ModuleTensor& t : ModuleTensors(module)) {
    if (auto layer = quantized.find(t.name); layer != quantized.end()) {
      const QuantizedWeight& weight = *layer->second->quantized();
      const int64_t block_size = BlockSize(weight);
      const Quantized q = QuantizeLikeBitsandbytes(
          weight.DequantizeRows(0, weight.rows(), at::kFloat).cpu(), block_size);
      out.tensors.emplace_back(t.name, q.packed);
      out.tensors.emplace_back(t.name + ".absmax", q.absmax);
      out.tensors.emplace_back(t.name + ".quant_map",
                               at::tensor(std::vector<float>(kernels::kNf4Codebook.begin(),
                                                             kernels::kNf4Codebook.end())));
      out.tensors.emplace_back(t.name + ".quant_state.bitsandbytes__nf4",
                               PackedQuantState(block_size, dtype, weight.rows(), weight.cols()));
      out.compute_dtype = TorchDtypeName(weight.compute_dtype());
    } else if (!dropped.count(t.name)) {
      out.tensors.emplace_back(t.name, ExportedTensor(t.tensor, dtype));
    }
  }
  return out;
}

}  // namespace engine
