// The `mlp` model loader: a multi-layer perceptron classifier built from options, sized from the
// data.
//
// Parameters are named "layers.<i>.weight" / "layers.<i>.bias" for the hidden layers and
// "head.weight" / "head.bias" for the output layer. The loss is the mean cross-entropy over the
// batch; the metric "accuracy" (in eval mode) counts exact predictions. Each hidden layer (with its
// activation and dropout) is a block (engine/model_block.h).
#include <ATen/ops/argmax.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/tanh.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <nlohmann/json.hpp>

#include "engine/format.h"
#include "engine/model.h"
#include "engine/model_block.h"
#include "engine/precision_context.h"
#include "mlp_options.pb.h"

namespace engine::plugins {
namespace {

struct MlpConfig {
  int64_t input_dim = 0;
  std::vector<int64_t> hidden_units;
  int64_t num_classes = 0;
  MlpOptions::Activation activation = MlpOptions::RELU;
  double dropout = 0;
  std::string input_field;
  std::string label_field;
  bool head_compute_fp32 = false;
  at::ScalarType param_dtype = at::kFloat;
};

class MlpModule : public torch::nn::Module {
 public:
  explicit MlpModule(const MlpConfig& config) : config_(config) {
    layers_ = register_module("layers", torch::nn::ModuleList());
    int64_t width = config.input_dim;
    for (int64_t units : config.hidden_units) {
      layers_->push_back(torch::nn::Linear(width, units));
      width = units;
    }
    head_ = register_module("head", torch::nn::Linear(width, config.num_classes));
    if (!layers_->is_empty()) first_weight_ = layers_[0]->as<torch::nn::Linear>()->weight;
    if (config.param_dtype != at::kFloat) to(config.param_dtype);
  }

  // The names of the hidden layers, which Forward runs as blocks (engine/model_block.h).
  std::vector<std::string> block_names() const {
    std::vector<std::string> names;
    for (size_t i = 0; i < layers_->size(); ++i) names.push_back("layers." + std::to_string(i));
    return names;
  }

  // The dtype the first layer's weights are stored in; inputs are cast to it.
  at::ScalarType input_dtype() const {
    return first_weight_.defined() ? first_weight_.scalar_type() : head_->weight.scalar_type();
  }

  at::Tensor forward(at::Tensor x) {
    x = x.reshape({x.size(0), -1});
    for (const auto& layer : *layers_) {
      auto* linear = layer->as<torch::nn::Linear>();
      x = RunBlock(
          *layer, [this, linear](const at::Tensor& in) { return Layer(*linear, in); }, x,
          /*checkpointing=*/false);
    }
    if (!config_.head_compute_fp32) return head_->forward(x);
    // Declared to the plan: the head computes in f32 whatever the autocast dtype.
    auto scope = PrecisionContext::None().Enter();
    return head_->forward(x.to(at::kFloat));
  }

 private:
  // A hidden layer: its linear map, activation and dropout.
  at::Tensor Layer(torch::nn::LinearImpl& linear, at::Tensor x) {
    x = linear.forward(x);
    switch (config_.activation) {
      case MlpOptions::GELU:
        x = at::gelu(x);
        break;
      case MlpOptions::TANH:
        x = at::tanh(x);
        break;
      case MlpOptions::RELU:
      default:
        x = at::relu(x);
        break;
    }
    if (config_.dropout > 0) x = at::dropout(x, config_.dropout, is_training());
    return x;
  }

  MlpConfig config_;
  torch::nn::ModuleList layers_{nullptr};
  torch::nn::Linear head_{nullptr};
  at::Tensor first_weight_;  // shares the first layer's parameter, whatever its dtype becomes
};

class MlpModel : public Model {
 public:
  explicit MlpModel(MlpConfig config)
      : config_(std::move(config)), module_(std::make_shared<MlpModule>(config_)) {}

  torch::nn::Module& module() override { return *module_; }

  StatusOr<ModelOutput> Forward(const Batch& batch) override {
    auto input = batch.find(config_.input_field);
    auto labels = batch.find(config_.label_field);
    if (input == batch.end() || labels == batch.end()) {
      return InvalidArgumentError("the batch lacks '" + config_.input_field + "' or '" +
                                  config_.label_field + "'");
    }
    at::Tensor x = input->second;
    const auto parameter_dtype = module_->input_dtype();
    if (x.scalar_type() != parameter_dtype) x = x.to(parameter_dtype);
    at::Tensor logits = module_->forward(x);
    ModelOutput out;
    out.loss = at::cross_entropy_loss(logits, labels->second);
    out.loss_count = labels->second.numel();
    // Accuracy costs a synchronisation; the engine reads metrics only when evaluating.
    if (!module_->is_training()) {
      const double correct = at::argmax(logits, 1).eq(labels->second).sum().item<double>();
      out.metrics["accuracy"] = {correct, static_cast<double>(out.loss_count)};
    }
    return out;
  }

  std::string architecture() const override { return "mlp"; }
  std::vector<std::string> blocks() const override { return module_->block_names(); }
  bool EvaluatesBlockByBlock(const Batch&) const override { return true; }

  std::vector<ComputeDeclaration> compute_declarations() const override {
    if (!config_.head_compute_fp32) return {};
    return {{"head.*", at::kFloat, "the mlp's head_compute_fp32 option"}};
  }

  std::string config_json() const override {
    static const char* kActivations[] = {"relu", "gelu", "tanh"};
    nlohmann::json j = {{"architecture", "mlp"},
                        {"input_dim", config_.input_dim},
                        {"hidden_units", config_.hidden_units},
                        {"num_classes", config_.num_classes},
                        {"activation", kActivations[config_.activation]},
                        {"dropout", config_.dropout},
                        {"input_field", config_.input_field},
                        {"label_field", config_.label_field},
                        {"head_compute_fp32", config_.head_compute_fp32}};
    return j.dump();
  }

 private:
  MlpConfig config_;
  std::shared_ptr<MlpModule> module_;
};

class MlpLoader : public ModelLoaderPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return MlpOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& message,
                       OptionErrors* errors) const override {
    const auto& options = OptionsAs<MlpOptions>(message);
    for (int i = 0; i < options.hidden_units_size(); ++i) {
      if (options.hidden_units(i) == 0) {
        errors->Add("hidden_units[" + std::to_string(i) + "]", "a layer needs at least one unit");
      }
    }
    if (!(options.dropout() >= 0 && options.dropout() < 1)) {
      errors->Add("dropout", "must be in [0, 1) (got " + FormatNumber(options.dropout()) + ")");
    }
  }

  StatusOr<std::unique_ptr<Model>> Create(const google::protobuf::Message& message,
                                          const ModelContext& context) const override {
    const auto& options = OptionsAs<MlpOptions>(message);
    if (context.data == nullptr) return InvalidArgumentError("mlp needs a data specification");
    const DataSpec& data = *context.data;
    const FieldSpec* input = data.Find(options.input_field());
    const FieldSpec* labels = data.Find(options.label_field());
    if (input == nullptr || !at::isFloatingType(input->dtype)) {
      return InvalidArgumentError("mlp needs a float field '" + options.input_field() +
                                  "' from the data loader, which provides: " + data.ToString());
    }
    if (labels == nullptr || at::isFloatingType(labels->dtype) || labels->num_classes <= 0) {
      return InvalidArgumentError("mlp needs an integer class-label field '" +
                                  options.label_field() +
                                  "' with a number of classes from the data loader, which "
                                  "provides: " +
                                  data.ToString());
    }
    MlpConfig config;
    config.input_dim = 1;
    for (int64_t d : input->shape) {
      if (d <= 0) {
        return InvalidArgumentError("mlp needs field '" + options.input_field() +
                                    "' to have a fixed size per example");
      }
      config.input_dim *= d;
    }
    config.hidden_units.assign(options.hidden_units().begin(), options.hidden_units().end());
    if (config.hidden_units.empty()) config.hidden_units = {128};
    config.num_classes = labels->num_classes;
    config.activation = options.activation();
    config.dropout = options.dropout();
    config.input_field = options.input_field();
    config.label_field = options.label_field();
    config.head_compute_fp32 = options.head_compute_fp32();
    config.param_dtype = options.param_dtype() == MlpOptions::BF16  ? at::kBFloat16
                         : options.param_dtype() == MlpOptions::F16 ? at::kHalf
                                                                    : at::kFloat;
    return std::unique_ptr<Model>(new MlpModel(std::move(config)));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("mlp", ENGINE_KIND_MODEL_LOADER, "0.1.0",
              "a multi-layer perceptron classifier, sized from the data's fields",
              engine::plugins::MlpLoader)
