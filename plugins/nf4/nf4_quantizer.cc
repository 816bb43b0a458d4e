// The `nf4` quantizer: QLoRA's 4-bit NormalFloat with bitsandbytes' codebook, packing and blocks
// (engine_kernels/nf4.h), optionally double-quantized scales, and a declared compute dtype.
//
// A quantized layer stores "weight" (u8, two codes per byte, first element high), and either
// "weight_absmax" (f32 per block) or, double-quantized, "weight_absmax_codes" (u8 per block),
// "weight_absmax_scales" (f32 per 256 blocks) and "weight_absmax_mean" (f32).
#include <ATen/ATen.h>

#include "engine/format.h"
#include "engine/quantizer.h"
#include "engine_kernels/nf4.h"
#include "nf4_options.pb.h"

namespace engine::plugins {
namespace {

c10::ScalarType ComputeDtype(Nf4Options::ComputeDtype d) {
  switch (d) {
    case Nf4Options::FP16:
      return at::kHalf;
    case Nf4Options::FP32:
      return at::kFloat;
    default:
      return at::kBFloat16;
  }
}

class Nf4Weight : public QuantizedWeight {
 public:
  Nf4Weight(kernels::Nf4Tensor q, c10::ScalarType compute) : q_(std::move(q)), compute_(compute) {}

  std::string format() const override { return "nf4"; }
  int64_t rows() const override { return q_.shape[0]; }
  int64_t cols() const override { return q_.shape[1]; }
  c10::ScalarType compute_dtype() const override { return compute_; }

  at::Tensor DequantizeRows(int64_t begin, int64_t end, c10::ScalarType dtype) const override {
    return kernels::DequantizeNf4Range(q_, begin * cols(), end * cols(), dtype)
        .view({end - begin, cols()});
  }

  std::vector<std::pair<std::string, at::Tensor>> tensors() const override {
    if (!q_.double_quantized()) return {{"weight", q_.packed}, {"weight_absmax", q_.absmax}};
    return {{"weight", q_.packed},
            {"weight_absmax_codes", q_.absmax_codes},
            {"weight_absmax_scales", q_.absmax_scales},
            {"weight_absmax_mean", q_.absmax_mean}};
  }

  StatusOr<std::shared_ptr<QuantizedWeight>> QuantizeLike(const at::Tensor& dense) const override {
    if (dense.sizes().vec() != q_.shape) {
      return InvalidArgumentError("nf4: the new weight's shape differs from the quantized one");
    }
    return std::shared_ptr<QuantizedWeight>(std::make_shared<Nf4Weight>(
        kernels::QuantizeNf4(dense.detach().cpu(), q_.block_size, q_.double_quantized()),
        compute_));
  }

 private:
  kernels::Nf4Tensor q_;
  c10::ScalarType compute_;
};

class Nf4Quantizer : public QuantizerPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return Nf4Options::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& options,
                       OptionErrors* errors) const override {
    const auto& o = OptionsAs<Nf4Options>(options);
    if (!kernels::IsValidNf4BlockSize(o.block_size())) {
      errors->Add("block_size", "is " + std::to_string(o.block_size()) +
                                    "; it must be a power of two from 32 to 4096 (64 is "
                                    "bitsandbytes' default)");
    }
  }

  std::vector<std::string> targets(const google::protobuf::Message& options) const override {
    const auto& o = OptionsAs<Nf4Options>(options);
    return {o.target_modules().begin(), o.target_modules().end()};
  }

  StatusOr<std::shared_ptr<QuantizedWeight>> Quantize(const google::protobuf::Message& options,
                                                      const at::Tensor& weight) const override {
    const auto& o = OptionsAs<Nf4Options>(options);
    if (weight.dim() != 2) return InvalidArgumentError("nf4 quantizes 2-D weights only");
    if (!at::isFloatingType(weight.scalar_type()) || weight.scalar_type() == at::kDouble) {
      return InvalidArgumentError("nf4 quantizes f32, bf16 or f16 weights, not " +
                                  std::string(c10::toString(weight.scalar_type())));
    }
    if (!at::isfinite(weight).all().item<bool>()) {
      return InvalidArgumentError("the weight holds inf or NaN, which NF4 cannot represent");
    }
    return std::shared_ptr<QuantizedWeight>(
        std::make_shared<Nf4Weight>(kernels::QuantizeNf4(weight, o.block_size(), o.double_quant()),
                                    ComputeDtype(o.compute_dtype())));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("nf4", ENGINE_KIND_QUANTIZER, "0.1.0",
              "4-bit NormalFloat weights (QLoRA, bitsandbytes' layout), block absmax scales",
              engine::plugins::Nf4Quantizer)
