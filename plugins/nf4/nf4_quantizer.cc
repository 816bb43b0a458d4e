// The `nf4` quantizer: QLoRA's 4-bit NormalFloat with bitsandbytes' codebook, packing and blocks
// (engine_kernels/nf4.h), optionally double-quantized scales, and a declared compute dtype.
//
// What a quantized layer stores is Nf4Weight's (nf4_weight.h).
#include <ATen/ATen.h>

#include "engine/dtype.h"
#include "engine/format.h"
#include "engine/quantizer.h"
#include "engine_kernels/nf4.h"
#include "nf4_options.pb.h"
#include "nf4_weight.h"

namespace engine::plugins {
namespace {

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
                                    ScalarTypeOf(o.compute_dtype())));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("nf4", ENGINE_KIND_QUANTIZER, "0.2.0",
              "4-bit NormalFloat weights (QLoRA, bitsandbytes' layout), block absmax scales",
              engine::plugins::Nf4Quantizer)
