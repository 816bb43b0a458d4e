// The `vlm` model loader: a small vision-language model. A ViT (`visual.*`) turns the image into
// patch tokens, a two-layer projector (`projector.linear_1`, `projector.linear_2`) maps them into
// the decoder's width, and a Llama decoder (`model.*`, `lm_head.*`) reads the image tokens followed
// by the text tokens.
//
// Batches need "pixel_values" (f32 [B, C, S, S]) and "input_ids"; "labels" (-100 where nothing is
// predicted) default to input_ids. Image positions are never predicted. Evaluation reports
// perplexity and token accuracy over the labelled tokens and, when the batch carries
// "prompt_length" and "answer_ids", exact match of greedily generated answers.
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu.h>
#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include "engine/linear.h"
#include "engine/model.h"
#include "engine/paths.h"
#include "hf_checkpoint.h"
#include "llama_modules.h"
#include "llama_setup.h"
#include "lm_metrics.h"
#include "transformer_options.pb.h"
#include "vision_modules.h"

namespace engine::transformer {
namespace {

class VlmModule : public torch::nn::Module {
 public:
  VlmModule(const VisionConfig& vision, const LlamaConfig& text) : lm(*this, text) {
    visual = register_module("visual", VisionTower(vision));
    auto projector = register_module("projector", std::make_shared<torch::nn::Module>());
    linear_1 = projector->register_module(
        "linear_1", engine::Linear(vision.hidden_size, text.hidden_size, /*bias=*/true));
    linear_2 = projector->register_module(
        "linear_2", engine::Linear(text.hidden_size, text.hidden_size, /*bias=*/true));
  }

  // [B, C, S, S] -> image tokens [B, patches, decoder width].
  at::Tensor ImageTokens(const at::Tensor& pixels, bool checkpointing) {
    const at::Tensor patches = visual->forward(pixels, checkpointing);
    return linear_2->forward(
        at::gelu(linear_1->forward(patches.to(linear_1->weight.scalar_type()))));
  }

  CausalLm lm;
  VisionTower visual{nullptr};
  engine::Linear linear_1{nullptr}, linear_2{nullptr};
};

class VlmModel : public Model {
 public:
  VlmModel(const VisionConfig& vision, const LlamaConfig& text, bool checkpointing,
           bool token_labels, int64_t eos_id)
      : vision_(vision),
        text_(text),
        checkpointing_(checkpointing),
        token_labels_(token_labels),
        eos_id_(eos_id),
        module_(std::make_shared<VlmModule>(vision, text)) {}

  torch::nn::Module& module() override { return *module_; }

  StatusOr<ModelOutput> Forward(const Batch& batch) override {
    auto pixels = batch.find("pixel_values");
    auto ids = batch.find("input_ids");
    if (pixels == batch.end() || ids == batch.end()) {
      return InvalidArgumentError("the batch needs 'pixel_values' and 'input_ids'");
    }
    auto labels = token_labels_ ? batch.find("labels") : batch.end();
    const at::Tensor& text_labels = labels != batch.end() ? labels->second : ids->second;
    const bool training = module_->is_training();
    const bool checkpointing = checkpointing_ && training;
    CausalLm& lm = module_->lm;
    const at::Tensor text = lm.model->Embed(ids->second);
    const at::Tensor image = module_->ImageTokens(pixels->second, checkpointing);
    const at::Tensor embeds = at::cat({image.to(text.scalar_type()), text}, 1);
    const at::Tensor hidden = lm.model->forward(embeds, 0, nullptr, checkpointing);
    const at::Tensor image_labels =
        at::full({text_labels.size(0), image.size(1)}, kIgnoreIndex, text_labels.options());
    ModelOutput out;
    CausalLmLoss(lm.Logits(hidden), at::cat({image_labels, text_labels}, 1), !training, &out,
                 eos_id_);
    if (!training) ENGINE_RETURN_IF_ERROR(ScoreGeneratedAnswers(lm, image, batch, eos_id_, &out));
    return out;
  }

  std::string architecture() const override { return "vlm"; }

  std::string config_json() const override {
    const std::string dtype = TorchDtypeName(module_->lm.model->embed_tokens->weight.scalar_type());
    nlohmann::json json = {
        {"architectures", {"EngineVlm"}},    {"model_type", "engine_vlm"},
        {"vision_config", vision_.ToJson()}, {"text_config", text_.ToJson(dtype)},
        {"projector_hidden_act", "gelu"},    {"torch_dtype", dtype}};
    return json.dump(2);
  }

 private:
  VisionConfig vision_;
  LlamaConfig text_;
  bool checkpointing_;
  bool token_labels_;
  int64_t eos_id_;
  std::shared_ptr<VlmModule> module_;
};

// The shape of one image, [C, S, S], from the data.
StatusOr<std::pair<int64_t, int64_t>> ImageShape(const DataSpec* data) {
  const FieldSpec* pixels = data != nullptr ? data->Find("pixel_values") : nullptr;
  if (pixels == nullptr || !at::isFloatingType(pixels->dtype) || pixels->shape.size() != 3 ||
      pixels->shape[1] != pixels->shape[2] || pixels->shape[1] <= 0 || pixels->shape[0] <= 0) {
    return InvalidArgumentError(
        "vlm needs a float field 'pixel_values' of square images [channels, size, size] from the "
        "data loader, which provides: " +
        (data != nullptr ? data->ToString() : std::string("nothing")));
  }
  return std::make_pair(pixels->shape[0], pixels->shape[1]);
}

class VlmLoader : public ModelLoaderPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return VlmOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& message,
                       OptionErrors* errors) const override {
    const auto& o = OptionsAs<VlmOptions>(message);
    if (o.has_pretrained()) {
      if (o.pretrained().empty()) errors->Add("pretrained", "is empty");
      if (o.has_vision() || o.has_decoder()) {
        errors->Add("pretrained",
                    "is set together with `vision` or `decoder`; the checkpoint's config.json "
                    "decides the sizes, remove one");
      }
      return;
    }
    ValidateLlamaOptions(o.decoder(), "decoder.", errors);
    const auto& v = o.vision();
    if (v.patch_size() == 0) errors->Add("vision.patch_size", "must be > 0");
    if (v.num_heads() == 0 || v.hidden_size() % v.num_heads() != 0) {
      errors->Add("vision.hidden_size", "must be a positive multiple of vision.num_heads");
    }
    if (v.num_layers() == 0 || v.num_layers() > 1024) {
      errors->Add("vision.num_layers", "must be in 1..1024");
    }
    if (v.hidden_size() > (1 << 16)) errors->Add("vision.hidden_size", "must be at most 65536");
    if (v.num_heads() > 1024) errors->Add("vision.num_heads", "must be at most 1024");
    if (v.mlp_ratio() > 64) errors->Add("vision.mlp_ratio", "must be at most 64");
    if (v.mlp_ratio() == 0) errors->Add("vision.mlp_ratio", "must be > 0");
    if (v.patch_size() > 4096) errors->Add("vision.patch_size", "must be at most 4096");
    if (!(v.layer_norm_eps() > 0)) errors->Add("vision.layer_norm_eps", "must be > 0");
  }

  StatusOr<std::unique_ptr<Model>> Create(const google::protobuf::Message& message,
                                          const ModelContext& context) const override {
    const auto& options = OptionsAs<VlmOptions>(message);
    ENGINE_ASSIGN_OR_RETURN(auto image, ImageShape(context.data));
    const int64_t eos_id = context.data->eos_id;
    if (!options.pretrained().empty()) return FromCheckpoint(options, context, image, eos_id);

    ENGINE_ASSIGN_OR_RETURN(VisionConfig vision,
                            VisionConfigFromOptions(options.vision(), image.first, image.second));
    ENGINE_ASSIGN_OR_RETURN(ResolvedLlama text,
                            ResolveLlama(options.decoder(), context.data, context.base_dir));
    const bool token_labels = UsesTokenLabels(context.data);
    return GuardModelBuild([&]() -> StatusOr<std::unique_ptr<Model>> {
      auto model = std::make_unique<VlmModel>(vision, text.config, options.gradient_checkpointing(),
                                              token_labels, eos_id);
      // The decoder gets Hugging Face's Llama initialisation; the vision tower and projector keep
      // LibTorch's (Kaiming-uniform) defaults, whose larger scale carries the image signal through
      // the untrained tower from the first step.
      auto& parts = static_cast<VlmModule&>(model->module());
      parts.lm.InitializeWeights();
      if (!text.pretrained_dir.empty()) {
        // Only the language model's tensors: a view holding the decoder and head by their names.
        torch::nn::Module language_model;
        language_model.register_module("model", parts.lm.model.ptr());
        if (parts.lm.lm_head) language_model.register_module("lm_head", parts.lm.lm_head.ptr());
        // The view's names are the model's own, so the stage's quantizer can act as they load.
        ENGINE_RETURN_IF_ERROR(LoadWeights(text.pretrained_dir, language_model,
                                           parts.lm.OptionalCheckpointTensors(), &context));
      }
      return std::unique_ptr<Model>(std::move(model));
    });
  }

 private:
  static StatusOr<std::unique_ptr<Model>> FromCheckpoint(const VlmOptions& options,
                                                         const ModelContext& context,
                                                         std::pair<int64_t, int64_t> image,
                                                         int64_t eos_id) {
    const std::filesystem::path dir = ResolvePath(context.base_dir, options.pretrained());
    ENGINE_ASSIGN_OR_RETURN(nlohmann::json json, ReadConfigJson(dir));
    const std::string where = "'" + (dir / "config.json").string() + "'";
    if (!json.is_object() || !json.contains("vision_config") || !json.contains("text_config")) {
      return InvalidArgumentError(where +
                                  " is not a vlm configuration (it needs vision_config "
                                  "and text_config)");
    }
    ENGINE_ASSIGN_OR_RETURN(VisionConfig vision,
                            VisionConfigFromJson(json["vision_config"], where + " vision_config"));
    ENGINE_ASSIGN_OR_RETURN(LlamaConfig text,
                            ConfigFromJson(json["text_config"], where + " text_config"));
    if (vision.channels != image.first || vision.image_size != image.second) {
      return InvalidArgumentError(
          where + ": the model reads images " + std::to_string(vision.channels) + "x" +
          std::to_string(vision.image_size) + "x" + std::to_string(vision.image_size) +
          " but the data's are " + std::to_string(image.first) + "x" +
          std::to_string(image.second) + "x" + std::to_string(image.second));
    }
    ENGINE_RETURN_IF_ERROR(CheckDataVocab(context.data, text.vocab_size));
    const bool token_labels = UsesTokenLabels(context.data);
    return GuardModelBuild([&]() -> StatusOr<std::unique_ptr<Model>> {
      std::unique_ptr<VlmModel> model;
      {
        // Every weight comes from the checkpoint: none is drawn first.
        UninitializedParametersScope uninitialized;
        model = std::make_unique<VlmModel>(vision, text, options.gradient_checkpointing(),
                                           token_labels, eos_id);
      }
      auto& parts = static_cast<VlmModule&>(model->module());
      ENGINE_RETURN_IF_ERROR(
          LoadWeights(dir, parts, parts.lm.OptionalCheckpointTensors(), &context));
      return std::unique_ptr<Model>(std::move(model));
    });
  }
};

}  // namespace
}  // namespace engine::transformer

ENGINE_PLUGIN("vlm", ENGINE_KIND_MODEL_LOADER, "0.1.0",
              "a small vision-language model: ViT (visual.*), projector (projector.*) and Llama "
              "decoder (model.*, lm_head.*), image tokens first",
              engine::transformer::VlmLoader)
