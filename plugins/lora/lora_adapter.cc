// The `lora` adapter: y = base(x) + scale * B(A(dropout(x))), scale = alpha / r (alpha / sqrt(r)
// with use_rslora), with A [r, in] Kaiming-uniform and B [out, r] zero, so the model's output is
// unchanged at initialisation; or, with `peft_adapter`, A and B and each layer's rank and scale as
// PEFT saved them (peft_lora_files.h). Works on dense and quantized engine::Linear layers alike (it
// only reads the layer's sizes).
//
// Parameters sit under the layer as PEFT names them ("...q_proj.lora_A.weight",
// "...q_proj.lora_B.weight"), and adapter_config.json is PEFT's, so PEFT loads an adapter-only
// checkpoint onto the same base model.
#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/adapter.h"
#include "engine/paths.h"
#include "lora_options.pb.h"
#include "peft_lora_files.h"

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

  // Trained values instead of the initial ones.
  void Load(const at::Tensor& a, const at::Tensor& b) {
    at::NoGradGuard no_grad;
    a_->weight.copy_(a);
    b_->weight.copy_(b);
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

std::filesystem::path PeftDir(const LoraOptions& o, const AdapterContext& context) {
  return ResolvePath(context.base_dir, o.peft_adapter());
}

StatusOr<std::shared_ptr<const safetensors::File>> OpenPeftWeights(const LoraOptions& o,
                                                                   const AdapterContext& context) {
  return safetensors::File::Open(PeftDir(o, context) / kPeftWeightsFile);
}

// With peft_adapter, settings given beside it (a pasted snippet's) must be the adapter's.
Status AgreesWithPeft(const LoraOptions& o, const PeftLoraConfig& config) {
  const auto differ = [&](const std::string& field, const std::string& ours,
                          const std::string& theirs) {
    return InvalidArgumentError(field + " is " + ours + ", but " + config.file.string() + " has " +
                                theirs + "; leave " + field + " out to take the adapter's");
  };
  const auto text = [](double value) {
    std::ostringstream out;
    out << std::setprecision(17) << value;
    return out.str();
  };
  if (o.has_r() && o.r() != config.r) {
    return differ("r", std::to_string(o.r()), std::to_string(config.r));
  }
  if (o.has_lora_alpha() && o.lora_alpha() != config.lora_alpha) {
    return differ("lora_alpha", text(o.lora_alpha()), text(config.lora_alpha));
  }
  if (o.has_lora_dropout() && o.lora_dropout() != config.lora_dropout) {
    return differ("lora_dropout", text(o.lora_dropout()), text(config.lora_dropout));
  }
  if (o.has_use_rslora() && o.use_rslora() != config.use_rslora) {
    return differ("use_rslora", o.use_rslora() ? "true" : "false",
                  config.use_rslora ? "true" : "false");
  }
  return Status::Ok();
}

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
    if (!o.has_peft_adapter()) return;
    if (o.peft_adapter().empty()) errors->Add("peft_adapter", "is empty; name PEFT's directory");
    const auto from_file = [&](bool set, const char* field) {
      if (set) {
        errors->Add(field, "comes from peft_adapter's adapter_model.safetensors; leave it out");
      }
    };
    from_file(o.target_modules_size() > 0, "target_modules");
  }

  // With peft_adapter: the modules its file has adapters for, by their full names.
  StatusOr<std::vector<std::string>> targets(const google::protobuf::Message& options,
                                             const AdapterContext& context) const override {
    const auto& o = OptionsAs<LoraOptions>(options);
    if (!o.has_peft_adapter()) {
      return std::vector<std::string>(o.target_modules().begin(), o.target_modules().end());
    }
    ENGINE_ASSIGN_OR_RETURN(const PeftLoraConfig config, ReadPeftLoraConfig(PeftDir(o, context)));
    ENGINE_RETURN_IF_ERROR(AgreesWithPeft(o, config));
    ENGINE_ASSIGN_OR_RETURN(auto weights, OpenPeftWeights(o, context));
    return PeftAdaptedModules(*weights, config);
  }

  // With peft_adapter: its modules_to_save and biases.
  StatusOr<safetensors::NamedTensors> SavedModelTensors(
      const google::protobuf::Message& options, const AdapterContext& context) const override {
    const auto& o = OptionsAs<LoraOptions>(options);
    if (!o.has_peft_adapter()) return safetensors::NamedTensors();
    ENGINE_ASSIGN_OR_RETURN(const PeftLoraConfig config, ReadPeftLoraConfig(PeftDir(o, context)));
    ENGINE_ASSIGN_OR_RETURN(auto weights, OpenPeftWeights(o, context));
    return PeftSavedModelTensors(*weights, config);
  }

  std::string targets_field(const google::protobuf::Message& options) const override {
    return OptionsAs<LoraOptions>(options).has_peft_adapter() ? "peft_adapter" : "target_modules";
  }

  StatusOr<std::shared_ptr<LinearAdapter>> Create(const google::protobuf::Message& options,
                                                  const AdapterContext& context,
                                                  const AdapterSite& site,
                                                  const LinearImpl& layer) const override {
    const auto& o = OptionsAs<LoraOptions>(options);
    if (o.has_peft_adapter()) return CreateFromPeft(o, context, site, layer);
    const int64_t r = o.r();
    if (r > std::min(layer.in_features(), layer.out_features())) {
      return InvalidArgumentError("rank " + std::to_string(r) + " is larger than the layer (" +
                                  std::to_string(layer.out_features()) + "x" +
                                  std::to_string(layer.in_features()) + ")");
    }
    const double rank = static_cast<double>(r);
    return std::shared_ptr<LinearAdapter>(std::make_shared<LoraAdapter>(
        layer.in_features(), layer.out_features(), r,
        o.lora_alpha() / (o.use_rslora() ? std::sqrt(rank) : rank), o.lora_dropout()));
  }

  // With peft_adapter, its settings (rank_pattern and alpha_pattern included), so that PEFT
  // computes what the stage trained.
  StatusOr<std::string> AdapterConfigJson(const google::protobuf::Message& options,
                                          const AdapterContext& context,
                                          const std::vector<std::string>& layers) const override {
    const auto& o = OptionsAs<LoraOptions>(options);
    // Full names: a bare "q_proj" would have PEFT wrap layers that were never trained.
    const std::set<std::string> modules(layers.begin(), layers.end());
    nlohmann::ordered_json config = {{"peft_type", "LORA"},
                                     {"task_type", "CAUSAL_LM"},
                                     {"r", o.r()},
                                     {"lora_alpha", o.lora_alpha()},
                                     {"lora_dropout", o.lora_dropout()},
                                     {"use_rslora", o.use_rslora()},
                                     {"target_modules", modules},
                                     {"bias", "none"},
                                     {"fan_in_fan_out", false},
                                     {"inference_mode", true},
                                     {"base_model_name_or_path", nullptr}};
    if (o.has_peft_adapter()) {
      ENGINE_ASSIGN_OR_RETURN(const PeftLoraConfig peft, ReadPeftLoraConfig(PeftDir(o, context)));
      if (!peft.task_type.empty()) config["task_type"] = peft.task_type;
      config["r"] = peft.r;
      config["lora_alpha"] = peft.lora_alpha;
      config["lora_dropout"] = peft.lora_dropout;
      config["use_rslora"] = peft.use_rslora;
      config["rank_pattern"] = nlohmann::ordered_json::object();
      for (const auto& [pattern, rank] : peft.rank_pattern) config["rank_pattern"][pattern] = rank;
      config["alpha_pattern"] = nlohmann::ordered_json::object();
      for (const auto& [pattern, alpha] : peft.alpha_pattern) {
        config["alpha_pattern"][pattern] = alpha;
      }
    }
    return config.dump(2) + "\n";
  }

 private:
  static StatusOr<std::shared_ptr<LinearAdapter>> CreateFromPeft(const LoraOptions& o,
                                                                 const AdapterContext& context,
                                                                 const AdapterSite& site,
                                                                 const LinearImpl& layer) {
    ENGINE_ASSIGN_OR_RETURN(const PeftLoraConfig config, ReadPeftLoraConfig(PeftDir(o, context)));
    ENGINE_ASSIGN_OR_RETURN(auto weights, OpenPeftWeights(o, context));
    // The name the file holds the layer by: transformers' module name, or for an adapter saved
    // against another version of the model class, the checkpoint's.
    const std::string& module =
        weights->Find("base_model.model." + site.module_name + ".lora_A.weight") != nullptr
            ? site.module_name
            : site.name;
    ENGINE_ASSIGN_OR_RETURN(const int64_t r, config.RankOf(module));
    ENGINE_ASSIGN_OR_RETURN(const double scale, config.ScaleOf(module));
    ENGINE_ASSIGN_OR_RETURN(
        auto ab, PeftLoraWeights(*weights, module, r, layer.in_features(), layer.out_features()));
    auto adapter = std::make_shared<LoraAdapter>(layer.in_features(), layer.out_features(), r,
                                                 scale, config.lora_dropout);
    adapter->Load(ab.first, ab.second);
    return std::shared_ptr<LinearAdapter>(adapter);
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("lora", ENGINE_KIND_ADAPTER, "0.1.0",
              "Low-rank adapters on linear layers (PEFT's names and adapter_config.json)",
              engine::plugins::LoraPlugin)
