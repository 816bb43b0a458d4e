// The `int8` quantizer: each weight row scaled by its absmax into int8 (LLM.int8()'s row-wise
// weight format, without its outlier decomposition), multiplied in a declared compute dtype.
//
// A quantized layer stores "weight" (i8 [out, in]) and "weight_scale" (f32 [out], absmax / 127).
#include <ATen/ATen.h>

#include "engine/dtype.h"
#include "engine/quantizer.h"
#include "int8_options.pb.h"

namespace engine::plugins {
namespace {

class Int8Weight : public QuantizedWeight {
 public:
  Int8Weight(at::Tensor codes, at::Tensor scale, c10::ScalarType compute)
      : codes_(std::move(codes)), scale_(std::move(scale)), compute_(compute) {}

  static std::shared_ptr<Int8Weight> Make(const at::Tensor& dense, c10::ScalarType compute) {
    const at::Tensor w = dense.detach().cpu().to(at::kFloat);
    const at::Tensor scale = w.abs().amax(1) / 127.0f;
    const at::Tensor safe = at::where(scale > 0, scale, at::ones_like(scale));
    at::Tensor codes = (w / safe.unsqueeze(1)).round().clamp(-127, 127).to(at::kChar);
    return std::make_shared<Int8Weight>(codes.contiguous(), scale.contiguous(), compute);
  }

  std::string format() const override { return "int8"; }
  int64_t rows() const override { return codes_.size(0); }
  int64_t cols() const override { return codes_.size(1); }
  c10::ScalarType compute_dtype() const override { return compute_; }

  at::Tensor DequantizeRows(int64_t begin, int64_t end, c10::ScalarType dtype) const override {
    const at::Tensor scale = scale_.narrow(0, begin, end - begin).to(at::kFloat).unsqueeze(1);
    return (codes_.narrow(0, begin, end - begin).to(at::kFloat) * scale).to(dtype);
  }

  std::vector<std::pair<std::string, at::Tensor>> tensors() const override {
    return {{"weight", codes_}, {"weight_scale", scale_}};
  }

  StatusOr<std::shared_ptr<QuantizedWeight>> QuantizeLike(const at::Tensor& dense) const override {
    if (dense.sizes() != codes_.sizes()) {
      return InvalidArgumentError("int8: the new weight's shape differs from the quantized one");
    }
    return std::shared_ptr<QuantizedWeight>(Make(dense, compute_));
  }

 private:
  at::Tensor codes_, scale_;
  c10::ScalarType compute_;
};

class Int8Quantizer : public QuantizerPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return Int8Options::default_instance();
  }

  std::vector<std::string> targets(const google::protobuf::Message& options) const override {
    const auto& o = OptionsAs<Int8Options>(options);
    return {o.target_modules().begin(), o.target_modules().end()};
  }

  StatusOr<std::shared_ptr<QuantizedWeight>> Quantize(const google::protobuf::Message& options,
                                                      const at::Tensor& weight) const override {
    if (weight.dim() != 2) return InvalidArgumentError("int8 quantizes 2-D weights only");
    if (!at::isFloatingType(weight.scalar_type())) {
      return InvalidArgumentError("int8 quantizes floating-point weights only");
    }
    if (!at::isfinite(weight).all().item<bool>()) {
      return InvalidArgumentError("the weight holds inf or NaN, which int8 cannot represent");
    }
    return std::shared_ptr<QuantizedWeight>(
        Int8Weight::Make(weight, ScalarTypeOf(OptionsAs<Int8Options>(options).compute_dtype())));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("int8", ENGINE_KIND_QUANTIZER, "0.1.0", "8-bit weights with one absmax scale per row",
              engine::plugins::Int8Quantizer)
