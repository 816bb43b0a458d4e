#include "qwen2_vl_loader.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <optional>

#include "engine/image_batch.h"
#include "engine/model.h"
#include "engine/model_logits.h"
#include "engine/paths.h"
#include "engine/text_generator.h"
#include "generation.h"
#include "hf_checkpoint.h"
#include "llama_setup.h"
#include "lm_metrics.h"
#include "plan_only_weights.h"
#include "transformer_options.pb.h"

namespace engine::transformer {
namespace {

class Qwen2VlFamilyModel : public Model,
                           public TextGenerator,
                           public ImageTextGenerator,
                           public LogitsModel {
 public:
  Qwen2VlFamilyModel(const Qwen2VlConfig& config, bool checkpointing, bool token_labels,
                     bool answers, int64_t eos_id)
      : checkpointing_(checkpointing),
        token_labels_(token_labels),
        answers_(answers),
        eos_id_(eos_id),
        module_(std::make_shared<Qwen2VlModule>(config)) {}

  torch::nn::Module& module() override { return *module_; }
  Qwen2VlModule& qwen2_vl() { return *module_; }
  // The decoder layers; the vision tower's blocks stay whole on every rank.
  std::vector<std::string> blocks() const override { return module_->lm.BlockNames(*module_); }
  // Its evaluation scores the answers teacher-forced, in the one forward.
  bool EvaluatesBlockByBlock(const Batch&) const override { return true; }

  // The positions and the image grids are worked out on the host: the trainer leaves these
  // fields there (or Forward copies them back).
  std::vector<std::string> host_fields() const override {
    return {"input_ids",     "attention_mask", "labels",
            kImageGridField, kVideoGridField,  kVideoSecondsField};
  }

  // The batch's images and videos (image_batch.h).
  StatusOr<std::pair<ImagesOfBatch, ImagesOfBatch>> VisualsOf(const Batch& batch) const {
    const int64_t patch_values = module_->config().vision.patch_values();
    ENGINE_ASSIGN_OR_RETURN(ImagesOfBatch images, UnpackImages(batch, patch_values));
    ENGINE_ASSIGN_OR_RETURN(ImagesOfBatch videos, UnpackImages(batch, patch_values, kVideoFields));
    return std::make_pair(std::move(images), std::move(videos));
  }

  StatusOr<ModelOutput> Forward(const Batch& batch) override {
    ENGINE_ASSIGN_OR_RETURN(BatchTokens tokens, TokensOf(batch, token_labels_));
    ENGINE_ASSIGN_OR_RETURN(auto visuals, VisualsOf(batch));
    const bool training = module_->is_training();
    ENGINE_ASSIGN_OR_RETURN(at::Tensor hidden,
                            module_->Hidden(tokens.ids, tokens.attention_mask, visuals.first,
                                            visuals.second, checkpointing_ && training));
    // Hidden moved what it needed; the loss needs the targets where the hidden states are, and
    // evaluation's exact match the mask too.
    tokens.targets = tokens.targets.to(hidden.device(), /*non_blocking=*/true);
    if (!training && tokens.attention_mask.defined()) {
      tokens.attention_mask = tokens.attention_mask.to(hidden.device(), /*non_blocking=*/true);
    }
    ModelOutput out;
    ScoreCausalLm(module_->lm, hidden, tokens, !training, answers_, eos_id_, &out);
    return out;
  }

  StatusOr<at::Tensor> Generate(const at::Tensor& ids, const at::Tensor& attention_mask,
                                const GenerationOptions& options) override {
    return GenerateText(module_->lm, ids, attention_mask, options);
  }

  StatusOr<BatchLogits> Logits(const Batch& batch) override {
    ENGINE_ASSIGN_OR_RETURN(BatchTokens tokens, TokensOf(batch, token_labels_));
    ENGINE_ASSIGN_OR_RETURN(auto visuals, VisualsOf(batch));
    BatchLogits out;
    ENGINE_ASSIGN_OR_RETURN(
        at::Tensor hidden,
        module_->Hidden(tokens.ids, tokens.attention_mask, visuals.first, visuals.second, false,
                        nullptr, nullptr, &out.position_ids));
    out.logits = module_->lm.Logits(hidden).to(at::kFloat);
    return out;
  }

  // The prompt (with its images) runs once into the cache, at its multimodal positions; the new
  // tokens continue from each row's largest position plus one.
  StatusOr<at::Tensor> GenerateWithImages(const at::Tensor& ids, const at::Tensor& attention_mask,
                                          const Batch& images,
                                          const GenerationOptions& options) override {
    CausalLm& lm = module_->lm;
    ENGINE_RETURN_IF_ERROR(CheckGenerationLength(lm, ids.size(1), options));
    ENGINE_ASSIGN_OR_RETURN(auto visuals, VisualsOf(images));
    at::NoGradGuard no_grad;
    KvCache cache;
    std::vector<int64_t> next;
    ENGINE_ASSIGN_OR_RETURN(
        at::Tensor hidden,
        module_->Hidden(ids, attention_mask, visuals.first, visuals.second, false, &cache, &next));
    DecoderInputs inputs;
    inputs.attention_mask = attention_mask;
    const at::Tensor next_positions = at::tensor(next, at::kLong).to(ids.device());
    return ContinueDecoding(lm, hidden, &cache, inputs, next_positions, options);
  }

  std::string architecture() const override { return module_->config().model_type(); }

  // Qwen2VLForConditionalGeneration's and Qwen2_5_VLForConditionalGeneration's modules
  // (transformers 5, and 4.52 on). Qwen3-VL's module already has their names.
  std::vector<std::pair<std::string, std::string>> transformers_module_prefixes() const override {
    if (module_->config().vision.family == VisionFamily::kQwen3Vl) return {};
    return {{"model.", "model.language_model."}, {"visual.", "model.visual."}};
  }

  std::string config_json() const override {
    const auto dtype = module_->lm.model->embed_tokens->weight.scalar_type();
    return module_->config().ToJson(TorchDtypeName(dtype)).dump(2);
  }

 private:
  bool checkpointing_;
  bool token_labels_;
  bool answers_;
  int64_t eos_id_;
  std::shared_ptr<Qwen2VlModule> module_;
};

// The data's images and videos must be cut as this model reads them.
Status CheckDataImages(const DataSpec* data, const Qwen2VlConfig& config,
                       const std::string& where) {
  for (const char* field : {kPixelValuesField, kVideoPixelValuesField}) {
    const FieldSpec* pixels = data != nullptr ? data->Find(field) : nullptr;
    if (pixels == nullptr) continue;
    const int64_t wanted = config.vision.patch_values();
    if (pixels->shape.size() != 2 || pixels->shape[1] != wanted) {
      return InvalidArgumentError(
          where + ": the model reads patches of " + std::to_string(wanted) +
          " values (3 x temporal_patch_size x patch_size^2) but the data's '" + field + "' are " +
          data->ToString() + " (another model's image or video processor?)");
    }
  }
  return Status::Ok();
}

constexpr char kOneSource[] =
    "set exactly one of `pretrained` (a model directory) and `config` (a config.json for random "
    "initialisation)";

}  // namespace

Qwen2VlFamilyLoader::Qwen2VlFamilyLoader(std::string model_type)
    : model_type_(std::move(model_type)) {}

const google::protobuf::Message& Qwen2VlFamilyLoader::default_options() const {
  return Qwen2VlOptions::default_instance();
}

void Qwen2VlFamilyLoader::ValidateOptions(const google::protobuf::Message& message,
                                          OptionErrors* errors) const {
  const auto& o = OptionsAs<Qwen2VlOptions>(message);
  if (!o.pretrained().empty() && !o.config().empty()) {
    errors->Add("config", kOneSource);
  }
}

StatusOr<std::unique_ptr<Model>> Qwen2VlFamilyLoader::Create(
    const google::protobuf::Message& message, const ModelContext& context) const {
  const auto& options = OptionsAs<Qwen2VlOptions>(message);
  // Neither is refused here rather than by ValidateOptions, so that the defaults validate.
  if (options.pretrained().empty() && options.config().empty()) {
    return InvalidArgumentError(std::string("no model: ") + kOneSource);
  }
  const bool pretrained = !options.pretrained().empty();
  const std::filesystem::path dir =
      pretrained ? ResolvePath(context.base_dir, options.pretrained()) : std::filesystem::path();
  const std::filesystem::path config_path =
      pretrained ? dir / "config.json" : ResolvePath(context.base_dir, options.config());
  ENGINE_ASSIGN_OR_RETURN(nlohmann::json json, ReadJsonFile(config_path));
  const std::string where = "'" + config_path.string() + "'";
  ENGINE_ASSIGN_OR_RETURN(Qwen2VlConfig config, Qwen2VlConfigFromJson(json, where));
  if (config.model_type() != model_type_) {
    return InvalidArgumentError(where + ": model_type is '" + config.model_type() +
                                "'; load it with the " + config.model_type() +
                                " model loader, not " + model_type_);
  }
  ENGINE_RETURN_IF_ERROR(CheckDataVocab(context.data, config.text.vocab_size));
  ENGINE_RETURN_IF_ERROR(CheckDataImages(context.data, config, where));
  const int64_t eos_id = context.data != nullptr ? context.data->eos_id : -1;
  const bool token_labels = UsesTokenLabels(context.data);
  return GuardModelBuild([&]() -> StatusOr<std::unique_ptr<Model>> {
    std::unique_ptr<Qwen2VlFamilyModel> model;
    {
      std::optional<UninitializedParametersScope> uninitialized;
      if (pretrained || context.plan_only) uninitialized.emplace();
      model = std::make_unique<Qwen2VlFamilyModel>(config, options.gradient_checkpointing(),
                                                   token_labels, LabelsMarkAnswers(context.data),
                                                   eos_id);
    }
    Qwen2VlModule& parts = model->qwen2_vl();
    if (!pretrained && context.plan_only) {
      ENGINE_RETURN_IF_ERROR(
          DrawQuantizedLayersOnly(parts, context, config.text.initializer_range));
      return std::unique_ptr<Model>(std::move(model));
    }
    if (!pretrained) {
      parts.lm.InitializeWeights();
      parts.visual->Initialize();
      return std::unique_ptr<Model>(std::move(model));
    }
    ENGINE_RETURN_IF_ERROR(LoadWeights(dir, parts, parts.lm.OptionalCheckpointTensors(), &context,
                                       Qwen2VlCheckpointRenames(config)));
    return std::unique_ptr<Model>(std::move(model));
  });
}

}  // namespace engine::transformer
