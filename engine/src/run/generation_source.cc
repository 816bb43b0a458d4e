#include "run/generation_source.h"

#include <ATen/ATen.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/peft_adapters.h"
#include "core/atomic_file.h"
#include "core/guarded_call.h"
#include "engine/paths.h"
#include "engine/untrusted_file.h"
#include "pipeline/resolved_pipeline.h"
#include "run/pipeline_session.h"
#include "run/stage_state.h"
#include "text/hf_json_tokenizer.h"
#include "text/stage_tokenizer.h"
#include "train/trainer.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

// The model_type of a model directory's config.json, which picks the loader that reads it.
StatusOr<std::string> DirectoryModelType(const fs::path& dir) {
  const fs::path file = dir / "config.json";
  ENGINE_ASSIGN_OR_RETURN(std::string text, ReadUntrustedFile(file, FileKind::kConfig));
  const auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    return InvalidArgumentError("'" + file.string() + "' is not a JSON object");
  }
  const auto type = json.find("model_type");
  if (type == json.end() || !type->is_string()) {
    return InvalidArgumentError("'" + file.string() +
                                "' has no model_type string, which says which model loader reads "
                                "the directory");
  }
  return type->get<std::string>();
}

// tokenizer.json, else a SentencePiece tokenizer.model, as transformers' AutoTokenizer prefers.
StatusOr<std::unique_ptr<Tokenizer>> DirectoryTokenizer(const fs::path& dir) {
  std::error_code error;
  if (fs::exists(dir / "tokenizer.json", error)) return LoadHfJsonTokenizer(dir);
  if (fs::exists(dir / "tokenizer.model", error)) {
    proto::TokenizerOptions options;
    options.set_kind(proto::TokenizerOptions::SENTENCEPIECE);
    options.set_model_file((dir / "tokenizer.model").string());
    return MakeTokenizer(options, dir);
  }
  return NotFoundError("'" + dir.string() +
                       "' has no tokenizer.json or tokenizer.model to encode prompts with");
}

// --device: cpu or cuda[:N], refused when this build or machine has no CUDA.
StatusOr<at::Device> ParseDevice(const std::string& text) {
  try {
    const at::Device device(text);
    if (device.is_cuda() && !at::hasCUDA()) {
      return FailedPreconditionError("--device " + text + ": this build or machine has no CUDA");
    }
    return device;
  } catch (...) {
    return InvalidArgumentError("--device must be cpu or cuda[:N], not '" + text + "'");
  }
}

class DirectorySource : public GenerationSource {
 public:
  static StatusOr<std::unique_ptr<GenerationSource>> Open(const fs::path& dir,
                                                          const GenerationSourceOptions& options) {
    auto source = std::unique_ptr<DirectorySource>(new DirectorySource());
    source->dir_ = fs::absolute(dir).lexically_normal();
    source->description_ = "model directory '" + source->dir_.string() + "'";
    source->files_dir_ = source->dir_;
    source->base_model_dir_ = source->dir_;
    ENGINE_RETURN_IF_ERROR(source->CheckEngineCheckpoint(options.command));
    ENGINE_ASSIGN_OR_RETURN(source->device_, ParseDevice(options.device));
    if (options.dtype != "auto") {
      ENGINE_ASSIGN_OR_RETURN(source->dtype_, ParseDtype(options.dtype));
    }
    ENGINE_RETURN_IF_ERROR(LoadPluginSearchPath(options.plugin_path, &source->registry_));
    ENGINE_RETURN_IF_ERROR(source->ReadImageProcessor(source->dir_ / kImageProcessorFile));
    if (fs::is_regular_file(source->dir_ / kVideoProcessorFile)) {
      source->video_processor_file_ = source->dir_ / kVideoProcessorFile;
      source->video_export_file_ = source->video_processor_file_;
    }
    if (!options.need_text) return std::unique_ptr<GenerationSource>(std::move(source));
    ENGINE_ASSIGN_OR_RETURN(source->tokenizer_, DirectoryTokenizer(source->dir_));
    ENGINE_RETURN_IF_ERROR(source->ReadChat(source->dir_));
    for (const char* file : {"config.json", "generation_config.json"}) {
      if (!fs::exists(source->dir_ / file)) continue;
      ENGINE_ASSIGN_OR_RETURN(std::string text,
                              ReadUntrustedFile(source->dir_ / file, FileKind::kConfig));
      source->AddStopIds(text);
    }
    return std::unique_ptr<GenerationSource>(std::move(source));
  }

  Status WithModel(const std::function<Status(Model&)>& use) override {
    ENGINE_ASSIGN_OR_RETURN(const std::string model_type,
                            DirectoryModelType(dir_).WithContext(description_));
    ENGINE_ASSIGN_OR_RETURN(const PluginRegistry::Entry* entry,
                            registry_.FindModelLoaderFor(model_type).WithContext(description_));
    const std::string& loader_name = entry->name;
    const auto& loader = static_cast<const ModelLoaderPlugin&>(*entry->plugin);
    const std::string context = "model loader '" + loader_name + "'";
    std::unique_ptr<google::protobuf::Message> options(loader.default_options().New());
    const auto* field = options->GetDescriptor()->FindFieldByName("pretrained");
    if (field == nullptr) return InternalError(context + " has no 'pretrained' option");
    options->GetReflection()->SetString(options.get(), field, dir_.string());
    ModelContext model_context;
    model_context.base_dir = dir_;
    StatusOr<std::unique_ptr<Model>> model =
        GuardedCall(context, [&] { return loader.Create(*options, model_context); });
    if (!model.ok()) return model.status().WithContext(description_);
    return GuardedCall(context, [&]() -> Status {
      torch::nn::Module& module = (*model)->module();
      if (dtype_) module.to(*dtype_);
      module.to(device_);
      module.eval();
      return use(**model);
    });
  }

 private:
  DirectorySource() = default;

  // An engine checkpoint is checked against its manifest first; one holding adapters is not a
  // plain model directory, and the error says how to use it.
  Status CheckEngineCheckpoint(const std::string& command) const {
    if (!fs::exists(dir_ / kManifestFile)) return Status::Ok();
    ENGINE_ASSIGN_OR_RETURN(proto::CheckpointManifest manifest, ReadManifest(dir_));
    ENGINE_RETURN_IF_ERROR(VerifyCheckpointFiles(dir_, manifest));
    const std::string use_the_stage = ": use the stage, as in `engine " + command +
                                      " PIPELINE.pbtxt:" + manifest.stage() + " --checkpoint " +
                                      dir_.string() + "`";
    ENGINE_ASSIGN_OR_RETURN(std::vector<std::string> weight_parts,
                            RankFiles(manifest, RankFile::kWeights));
    if (!weight_parts.empty()) {
      return FailedPreconditionError(
          "'" + dir_.string() + "' is a checkpoint of stage '" + manifest.stage() +
          "' whose ranks each wrote their parts of the weights (" + weight_parts.front() +
          ", ...; parallel.shard_level 3), not a model directory" + use_the_stage +
          ", or `engine export` it");
    }
    if (manifest.has_frozen_base()) {
      return FailedPreconditionError("'" + dir_.string() + "' is a checkpoint of stage '" +
                                     manifest.stage() +
                                     "' that holds only what it changed over the base in '" +
                                     manifest.frozen_base().pretrained() + "'" + use_the_stage);
    }
    for (const proto::PluginVersion& plugin : manifest.plugin()) {
      if (plugin.kind() != PluginKindName(PluginKind::kAdapter) &&
          plugin.kind() != PluginKindName(PluginKind::kQuantizer)) {
        continue;
      }
      return FailedPreconditionError("'" + dir_.string() + "' is a checkpoint of stage '" +
                                     manifest.stage() + "' with the " + plugin.kind() + " '" +
                                     plugin.name() + "', not a model directory" + use_the_stage);
    }
    return Status::Ok();
  }

  fs::path dir_;
  PluginRegistry registry_;
  std::optional<at::ScalarType> dtype_;
  at::Device device_ = at::kCPU;
};

class PipelineSource : public GenerationSource {
 public:
  static StatusOr<std::unique_ptr<GenerationSource>> Open(const fs::path& pipeline,
                                                          const std::string& stage_name,
                                                          const GenerationSourceOptions& options) {
    if (options.dtype != "auto" || options.device != "cpu") {
      return InvalidArgumentError(
          "--dtype and --device are for model directories: a stage generates on its own device "
          "and precision");
    }
    auto source = std::unique_ptr<PipelineSource>(new PipelineSource());
    ENGINE_RETURN_IF_ERROR(source->Plan(pipeline, stage_name, options));
    ENGINE_RETURN_IF_ERROR(source->ReadStageImageProcessor());
    if (options.need_text) ENGINE_RETURN_IF_ERROR(source->ReadTextSide());
    return std::unique_ptr<GenerationSource>(std::move(source));
  }

  Status WithModel(const std::function<Status(Model&)>& use) override {
    StageRunRequest request;
    request.pipeline = session_.pipeline.get();
    request.plan = const_cast<StagePlan*>(stage_plan_);
    request.stage_dir = session_.pipeline->output_dir / stage()->name;
    return WithStageModel(request, checkpoint_, use);
  }

 private:
  PipelineSource() = default;

  const ResolvedStage* stage() const override { return stage_plan_->stage; }
  fs::path pipeline_dir() const override { return session_.pipeline->base_dir; }

  Status Plan(const fs::path& pipeline, const std::string& stage_name,
              const GenerationSourceOptions& options) {
    LoadOptions load;
    if (!options.output_dir.empty()) load.output_dir = options.output_dir;
    BaseSearch bases;
    bases.dirs = BaseSearchPath(options.base_path);
    if (!options.checkpoint.empty()) bases.checkpoint = fs::absolute(options.checkpoint);
    const bool planned = LoadAndPlanSession(pipeline, options.plugin_path, load, &session_,
                                            PlanModels::kPlanOnly, bases);
    notes_ = session_.notes;
    if (!planned) {
      return InvalidArgumentError(session_.diagnostics.ToString());
    }
    ENGINE_ASSIGN_OR_RETURN(stage_plan_, FindStagePlan(*session_.plan, stage_name));
    checkpoint_ = options.checkpoint.empty()
                      ? FinalCheckpointDir(session_.pipeline->output_dir / stage()->name)
                      : fs::absolute(options.checkpoint);
    ENGINE_RETURN_IF_ERROR(CheckStageCheckpoint(session_, *stage(), checkpoint_));
    ENGINE_ASSIGN_OR_RETURN(stage_plan_, StagePlanWithModel(&session_, stage()->name));
    files_dir_ = checkpoint_;
    base_model_dir_ = PeftBaseModel(*stage(), *session_.pipeline);
    description_ = stage()->subject() + " of '" + pipeline.string() + "' (checkpoint " +
                   checkpoint_.string() + ")";
    return Status::Ok();
  }

  // The checkpoint's preprocessor_config.json (and video_preprocessor_config.json), or (for
  // checkpoints written before they carried one) the data's.
  Status ReadStageImageProcessor() {
    for (const fs::path& file : {checkpoint_ / kVideoProcessorFile,
                                 StageVideoProcessorPath(*stage(), session_.pipeline->base_dir)}) {
      if (video_processor_file_.empty() && !file.empty() && fs::is_regular_file(file)) {
        video_processor_file_ = file;
      }
    }
    const fs::path data_image_file = StageImageProcessorPath(*stage(), session_.pipeline->base_dir);
    // Only a file the image processor does not stand for is exported beside it.
    video_export_file_ = VideoProcessorToCarry(video_processor_file_, data_image_file);
    ENGINE_RETURN_IF_ERROR(ReadImageProcessor(checkpoint_ / kImageProcessorFile));
    if (image_processor() != nullptr) return Status::Ok();
    return ReadImageProcessor(data_image_file);
  }

  // The stage's tokenizer; the chat template beside the checkpoint (a stage that trained with a
  // tokenizer.json keeps its tokenizer files there); the tokenizer's and the model's eos ids.
  Status ReadTextSide() {
    const auto options = StageTokenizerOptions(*stage());
    if (!options) {
      return FailedPreconditionError(stage()->subject() +
                                     ": its data loader has no tokenizer, so there is no text to "
                                     "generate from");
    }
    ENGINE_ASSIGN_OR_RETURN(tokenizer_, MakeTokenizer(*options, session_.pipeline->base_dir));
    ENGINE_RETURN_IF_ERROR(ReadChat(checkpoint_));
    ENGINE_ASSIGN_OR_RETURN(std::string config, GuardedCall(stage_plan_->stage->model.context, [&] {
                              return StatusOr<std::string>(stage_plan_->model->config_json());
                            }));
    AddStopIds(config);
    if (fs::exists(checkpoint_ / "config.json")) {
      ENGINE_ASSIGN_OR_RETURN(std::string text,
                              ReadUntrustedFile(checkpoint_ / "config.json", FileKind::kConfig));
      AddStopIds(text);
    }
    return Status::Ok();
  }

  PipelineSession session_;
  const StagePlan* stage_plan_ = nullptr;
  fs::path checkpoint_;
};

// "p.pbtxt:sft" is the file and the stage when "p.pbtxt:sft" itself is not a file.
std::pair<fs::path, std::string> SplitPipelineAndStage(const std::string& source) {
  std::error_code error;
  const size_t colon = source.rfind(':');
  if (colon == std::string::npos || fs::exists(source, error)) return {source, ""};
  return {source.substr(0, colon), source.substr(colon + 1)};
}

}  // namespace

StatusOr<std::unique_ptr<GenerationSource>> GenerationSource::Open(
    const std::string& source, const GenerationSourceOptions& options) {
  std::error_code error;
  if (fs::is_directory(source, error)) {
    return DirectorySource::Open(source, options);
  }
  const auto [pipeline, stage] = SplitPipelineAndStage(source);
  if (!fs::is_regular_file(pipeline, error)) {
    return NotFoundError("'" + source +
                         "' is neither a model directory nor a pipeline file (PIPELINE.pbtxt or "
                         "PIPELINE.pbtxt:STAGE)");
  }
  return PipelineSource::Open(pipeline, stage, options);
}

StatusOr<at::ScalarType> ParseDtype(const std::string& text) {
  static const std::map<std::string, at::ScalarType> kNames = {
      {"float32", at::kFloat}, {"bfloat16", at::kBFloat16}, {"float16", at::kHalf},
      {"f32", at::kFloat},     {"bf16", at::kBFloat16},     {"f16", at::kHalf}};
  auto it = kNames.find(text);
  if (it == kNames.end()) {
    return InvalidArgumentError("--dtype must be auto, float32, bfloat16 or float16, not '" + text +
                                "'");
  }
  return it->second;
}

Status GenerationSource::ReadImageProcessor(const fs::path& file) {
  if (file.empty() || !fs::exists(file)) return Status::Ok();
  ENGINE_ASSIGN_OR_RETURN(image_processor_, Qwen2VlImageProcessor::Read(file));
  image_processor_file_ = file;
  return Status::Ok();
}

Status GenerationSource::ReadChat(const fs::path& dir) {
  StatusOr<chat::TokenizerChatConfig> config = chat::ReadTokenizerChatConfig(dir);
  if (config.ok()) {
    chat_ = std::move(*config);
    return Status::Ok();
  }
  if (config.status().code() != StatusCode::kNotFound) return config.status();
  chat_absence_ = "no chat template for '" + dir.string() + "' (" + config.status().message() + ")";
  return Status::Ok();
}

void GenerationSource::AddStopIds(const std::string& json_text) {
  auto add = [this](int64_t id) {
    if (id >= 0 && std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end()) {
      stop_ids_.push_back(id);
    }
  };
  add(tokenizer_->eos_id());
  const auto json = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("eos_token_id")) return;
  const nlohmann::json& eos = json["eos_token_id"];
  if (eos.is_number_integer()) add(eos.get<int64_t>());
  if (eos.is_array()) {
    for (const auto& id : eos) {
      if (id.is_number_integer()) add(id.get<int64_t>());
    }
  }
}

}  // namespace engine
