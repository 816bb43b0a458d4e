// The `llama` model loader: a Llama-family causal language model in Hugging Face's layout, built
// from options (random init) or read from a model directory (config.json + safetensors).
//
// Batches need "input_ids" (i64 [B, L]) and may carry "labels" (-100 where nothing is predicted;
// input_ids when absent), "attention_mask" (i64 or bool [B, L], 0 at padding: rows of unequal
// length, padded left or right; padding is never attended to nor predicted) and "position_ids"
// (i64 [B, L]; by default each row counts its own real tokens). Evaluation reports perplexity and
// token accuracy, exact match of the answers when the labels mark answers (chat data; greedy's,
// by teacher forcing), and exact match of generated answers when the batch carries
// "prompt_length" and "answer_ids".
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "attention_mask.h"
#include "engine/linear.h"
#include "engine/model.h"
#include "engine/model_logits.h"
#include "engine/text_generator.h"
#include "generation.h"
#include "hf_checkpoint.h"
#include "llama_config.h"
#include "llama_modules.h"
#include "llama_setup.h"
#include "lm_metrics.h"
#include "plan_only_weights.h"
#include "transformer_options.pb.h"

namespace engine::transformer {
namespace {

class LlamaForCausalLm : public torch::nn::Module {
 public:
  explicit LlamaForCausalLm(const LlamaConfig& config) : lm(*this, config) {}
  CausalLm lm;
};

class LlamaModel : public Model, public TextGenerator, public LogitsModel {
 public:
  LlamaModel(const LlamaConfig& config, bool checkpointing, bool token_labels, bool answers,
             int64_t eos_id)
      : config_(config),
        checkpointing_(checkpointing),
        token_labels_(token_labels),
        answers_(answers),
        eos_id_(eos_id),
        module_(std::make_shared<LlamaForCausalLm>(config)) {}

  torch::nn::Module& module() override { return *module_; }
  LlamaForCausalLm& causal_lm() { return *module_; }

  StatusOr<ModelOutput> Forward(const Batch& batch) override {
    ENGINE_ASSIGN_OR_RETURN(BatchTokens tokens, TokensOf(batch, token_labels_));
    CausalLm& lm = module_->lm;
    const bool training = module_->is_training();
    const at::Tensor hidden = lm.model->Forward(
        lm.model->Embed(tokens.ids), InputsOf(batch, tokens), nullptr, checkpointing_ && training);
    ModelOutput out;
    ScoreCausalLm(lm, hidden, tokens, !training, answers_, eos_id_, &out);
    if (!training) {
      ENGINE_RETURN_IF_ERROR(ScoreGeneratedAnswers(lm, at::Tensor(), batch, eos_id_, &out));
    }
    return out;
  }

  StatusOr<at::Tensor> Generate(const at::Tensor& ids, const at::Tensor& attention_mask,
                                const GenerationOptions& options) override {
    return GenerateText(module_->lm, ids, attention_mask, options);
  }

  // The positions are spelled out (each row counting its own real tokens where the batch gives
  // none), so that another library given them computes the same.
  StatusOr<BatchLogits> Logits(const Batch& batch) override {
    ENGINE_ASSIGN_OR_RETURN(BatchTokens tokens, TokensOf(batch, token_labels_));
    DecoderInputs inputs = InputsOf(batch, tokens);
    if (!inputs.position_ids.defined()) {
      inputs.position_ids =
          PositionIds(inputs.attention_mask, tokens.ids.size(1), 0, tokens.ids.device())
              .expand({tokens.ids.size(0), tokens.ids.size(1)})
              .contiguous();
    }
    CausalLm& lm = module_->lm;
    const at::Tensor hidden = lm.model->Forward(lm.model->Embed(tokens.ids), inputs, nullptr);
    return BatchLogits{lm.Logits(hidden).to(at::kFloat), inputs.position_ids};
  }

  std::string architecture() const override { return "llama"; }
  std::vector<std::string> blocks() const override { return module_->lm.BlockNames(*module_); }
  bool EvaluatesBlockByBlock(const Batch& batch) const override { return !GeneratesAnswers(batch); }

  std::string config_json() const override {
    return config_.ToJson(TorchDtypeName(module_->lm.model->embed_tokens->weight.scalar_type()))
        .dump(2);
  }

 private:
  static DecoderInputs InputsOf(const Batch& batch, const BatchTokens& tokens) {
    DecoderInputs inputs;
    inputs.attention_mask = tokens.attention_mask;
    if (auto positions = batch.find("position_ids"); positions != batch.end()) {
      inputs.position_ids = positions->second;
    }
    return inputs;
  }

  LlamaConfig config_;
  bool checkpointing_;
  bool token_labels_;
  bool answers_;
  int64_t eos_id_;
  std::shared_ptr<LlamaForCausalLm> module_;
};

class LlamaLoader : public ModelLoaderPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return LlamaOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& message,
                       OptionErrors* errors) const override {
    ValidateLlamaOptions(OptionsAs<LlamaOptions>(message), "", errors);
  }

  std::vector<std::string> model_types() const override {
    return {std::begin(kDecoderModelTypes), std::end(kDecoderModelTypes)};
  }

  StatusOr<std::unique_ptr<Model>> Create(const google::protobuf::Message& message,
                                          const ModelContext& context) const override {
    const auto& options = OptionsAs<LlamaOptions>(message);
    ENGINE_ASSIGN_OR_RETURN(ResolvedLlama resolved,
                            ResolveLlama(options, context.data, context.base_dir));
    const int64_t eos_id = context.data != nullptr ? context.data->eos_id : -1;
    const bool token_labels = UsesTokenLabels(context.data);
    return GuardModelBuild([&]() -> StatusOr<std::unique_ptr<Model>> {
      const bool pretrained = !resolved.pretrained_dir.empty();
      std::unique_ptr<LlamaModel> model;
      {
        // Random values for weights the checkpoint replaces would cost time and memory.
        std::optional<UninitializedParametersScope> uninitialized;
        if (pretrained || context.plan_only) uninitialized.emplace();
        model = std::make_unique<LlamaModel>(resolved.config, options.gradient_checkpointing(),
                                             token_labels, LabelsMarkAnswers(context.data), eos_id);
      }
      if (!pretrained && context.plan_only) {
        ENGINE_RETURN_IF_ERROR(
            DrawQuantizedLayersOnly(model->module(), context, resolved.config.initializer_range));
      } else if (!pretrained) {
        InitializeWeights(model->module(), resolved.config.initializer_range);
      } else {
        ENGINE_RETURN_IF_ERROR(LoadWeights(resolved.pretrained_dir, model->module(),
                                           model->causal_lm().lm.OptionalCheckpointTensors(),
                                           &context));
      }
      return std::unique_ptr<Model>(std::move(model));
    });
  }
};

}  // namespace
}  // namespace engine::transformer

ENGINE_PLUGIN("llama", ENGINE_KIND_MODEL_LOADER, "0.1.0",
              "a Llama-family causal language model (Hugging Face layout), from options or a "
              "model directory",
              engine::transformer::LlamaLoader)
