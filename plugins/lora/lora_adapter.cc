// The `lora` adapter: y = base(x) + (alpha / r) * B(A(dropout(x))), with A [r, in] Kaiming-uniform
// and B [out, r] zero, so the model's output is unchanged at initialisation. Works on dense and
// quantized engine::Linear layers alike (it only reads the layer's sizes).
//
// Parameters sit under the layer as PEFT names them ("...q_proj.lora_A.weight",
// "...q_proj.lora_B.weight"), and adapter_config.json is PEFT's, so PEFT loads an adapter-only
// checkpoint onto the same base model.
#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/adapter.h"
#include "lora_options.pb.h"

namespace engine::plugins {
namespace {

class LoraAdapter : public LinearAdapter {
 public:
  LoraAdapter(int64_t in, int64_t out, int64_t r, double scale, double dropout)
      : scale_(scale), dropout_(dropout) {
    a_ = torch::nn::Linear(torch::nn::LinearOptions(in, r).bias(false));
    b_ = torch::nn::Linear(torch::nn::LinearOptions(r, out).bias(false));
    at::NoGradGuard no_grad;
    torch::nn::init::kaiming_uniform_(a_->weight, std::sqrt(5.0));
    b_->weight.zero_();
  }

  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules() override {
    return {{"lora_A", a_.ptr()}, {"lora_B", b_.ptr()}};
  }

  at::Tensor Delta(const at::Tensor& x) override {
    const at::Tensor input = dropout_ > 0 ? at::dropout(x, dropout_, a_->is_training()) : x;
    return b_->forward(a_->forward(input.to(a_->weight.scalar_type()))) * scale_;
  }

  at::Tensor WeightDelta() override {
    return at::matmul(b_->weight.detach().to(at::kFloat), a_->weight.detach().to(at::kFloat)) *
           scale_;
  }

 private:
  torch::nn::Linear a_{nullptr}, b_{nullptr};
  double scale_, dropout_;
};

class LoraPlugin : public AdapterPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return LoraOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& options,
                       OptionErrors* errors) const override {
    const auto& o = OptionsAs<LoraOptions>(options);
    if (o.r() == 0) errors->Add("r", "is 0; the rank must be at least 1 (8 and 16 are usual)");
    if (o.r() > 65536) errors->Add("r", "is " + std::to_string(o.r()) + "; at most 65,536");
    if (!(o.lora_alpha() > 0) || !std::isfinite(o.lora_alpha())) {
      errors->Add("lora_alpha", "must be a positive number (the output scale is lora_alpha / r)");
    }
    if (!(o.lora_dropout() >= 0 && o.lora_dropout() < 1)) {
      errors->Add("lora_dropout", "must be in [0, 1)");
    }
  }

  std::vector<std::string> targets(const google::protobuf::Message& options) const override {
    const auto& o = OptionsAs<LoraOptions>(options);
    return {o.target_modules().begin(), o.target_modules().end()};
  }

  StatusOr<std::shared_ptr<LinearAdapter>> Create(const google::protobuf::Message& options,
                                                  const LinearImpl& layer) const override {
    const auto& o = OptionsAs<LoraOptions>(options);
    const int64_t r = o.r();
    if (r > std::min(layer.in_features(), layer.out_features())) {
      return InvalidArgumentError("rank " + std::to_string(r) + " is larger than the layer (" +
                                  std::to_string(layer.out_features()) + "x" +
                                  std::to_string(layer.in_features()) + ")");
    }
    return std::shared_ptr<LinearAdapter>(
        std::make_shared<LoraAdapter>(layer.in_features(), layer.out_features(), r,
                                      o.lora_alpha() / static_cast<double>(r), o.lora_dropout()));
  }

  std::string AdapterConfigJson(const google::protobuf::Message& options,
                                const std::vector<std::string>& layers) const override {
    const auto& o = OptionsAs<LoraOptions>(options);
    // Full names: a bare "q_proj" would have PEFT wrap layers that were never trained.
    const std::set<std::string> modules(layers.begin(), layers.end());
    nlohmann::json config = {{"peft_type", "LORA"},
                             {"task_type", "CAUSAL_LM"},
                             {"r", o.r()},
                             {"lora_alpha", o.lora_alpha()},
                             {"lora_dropout", o.lora_dropout()},
                             {"target_modules", modules},
                             {"bias", "none"},
                             {"fan_in_fan_out", false},
                             {"inference_mode", true},
                             {"base_model_name_or_path", nullptr}};
    return config.dump(2) + "\n";
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("lora", ENGINE_KIND_ADAPTER, "0.1.0",
              "Low-rank adapters on linear layers (PEFT's names and adapter_config.json)",
              engine::plugins::LoraPlugin)
