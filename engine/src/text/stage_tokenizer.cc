#include "text/stage_tokenizer.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <nlohmann/json.hpp>

#include "engine/paths.h"
#include "engine/qwen2_vl_image_processor.h"
#include "engine/tokenizer.h"
#include "engine/untrusted_file.h"
#include "pipeline/pretrained_dir.h"

namespace engine {

std::optional<proto::TokenizerOptions> StageTokenizerOptions(const ResolvedStage& stage) {
  if (stage.data.options == nullptr) return std::nullopt;
  const google::protobuf::Message& options = *stage.data.options;
  const auto* field = TokenizerOptionsField(options);
  if (field == nullptr) return std::nullopt;
  // The loader's library may hold its own copy of the generated class: go through bytes.
  proto::TokenizerOptions tokenizer;
  if (!tokenizer.ParseFromString(
          options.GetReflection()->GetMessage(options, field).SerializeAsString())) {
    return std::nullopt;
  }
  return tokenizer;
}

std::filesystem::path ImageProcessorPath(const proto::TokenizerOptions& tokenizer,
                                         const std::string& named,
                                         const std::filesystem::path& base_dir) {
  if (!named.empty()) return ResolvePath(base_dir, named);
  std::filesystem::path config =
      ResolvePath(base_dir, tokenizer.config().empty() ? tokenizer.path() : tokenizer.config());
  if (!std::filesystem::is_directory(config)) config = config.parent_path();
  return config / kImageProcessorFile;
}

namespace {

// The data's `<field> { processor }` (images, videos), read by reflection: the loader's options
// type is its own. Empty when it has none.
std::string NamedProcessor(const ResolvedStage& stage, const char* field) {
  const google::protobuf::Message& options = *stage.data.options;
  const auto* message = options.GetDescriptor()->FindFieldByName(field);
  if (message == nullptr || message->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE ||
      message->is_repeated() || !options.GetReflection()->HasField(options, message)) {
    return "";
  }
  const google::protobuf::Message& inner = options.GetReflection()->GetMessage(options, message);
  const auto* processor = inner.GetDescriptor()->FindFieldByName("processor");
  if (processor == nullptr || processor->type() != google::protobuf::FieldDescriptor::TYPE_STRING) {
    return "";
  }
  return inner.GetReflection()->GetString(inner, processor);
}

}  // namespace

std::filesystem::path StageImageProcessorPath(const ResolvedStage& stage,
                                              const std::filesystem::path& base_dir) {
  const auto tokenizer = StageTokenizerOptions(stage);
  if (!tokenizer || tokenizer->kind() != proto::TokenizerOptions::HF_JSON) return {};
  return ImageProcessorPath(*tokenizer, NamedProcessor(stage, "images"), base_dir);
}

std::filesystem::path StageVideoProcessorPath(const ResolvedStage& stage,
                                              const std::filesystem::path& base_dir) {
  const auto tokenizer = StageTokenizerOptions(stage);
  if (!tokenizer || tokenizer->kind() != proto::TokenizerOptions::HF_JSON) return {};
  const std::string named = NamedProcessor(stage, "videos");
  return Qwen2VlImageProcessor::VideoFileFor(
      named.empty() ? ImageProcessorPath(*tokenizer, "", base_dir).parent_path()
                    : ResolvePath(base_dir, named));
}

std::filesystem::path VideoProcessorToCarry(const std::filesystem::path& video,
                                            const std::filesystem::path& image) {
  if (video.empty() || !std::filesystem::is_regular_file(video)) return {};
  if (video.filename() == kVideoProcessorFile) return video;
  std::error_code error;
  return std::filesystem::equivalent(video, image, error) ? std::filesystem::path() : video;
}

StatusOr<std::map<std::string, std::string>> StageTokenizerFiles(
    const ResolvedStage& stage, const std::filesystem::path& base_dir) {
  std::map<std::string, std::string> files;
  const auto options = StageTokenizerOptions(stage);
  if (!options || options->kind() != proto::TokenizerOptions::HF_JSON) return files;
  std::filesystem::path json = ResolvePath(base_dir, options->path());
  if (std::filesystem::is_directory(json)) json /= "tokenizer.json";
  ENGINE_ASSIGN_OR_RETURN(files["tokenizer.json"], ReadUntrustedFile(json, FileKind::kTokenizer));
  const std::filesystem::path config = options->config().empty()
                                           ? json.parent_path() / "tokenizer_config.json"
                                           : ResolvePath(base_dir, options->config());
  if (std::filesystem::exists(config)) {
    ENGINE_ASSIGN_OR_RETURN(files["tokenizer_config.json"],
                            ReadUntrustedFile(config, FileKind::kConfig));
  }
  const std::filesystem::path image = StageImageProcessorPath(stage, base_dir);
  for (const auto& [name, processor] :
       {std::pair<const char*, std::filesystem::path>{kImageProcessorFile, image},
        {kVideoProcessorFile,
         VideoProcessorToCarry(StageVideoProcessorPath(stage, base_dir), image)}}) {
    if (!std::filesystem::is_regular_file(processor)) continue;
    ENGINE_ASSIGN_OR_RETURN(files[name], ReadUntrustedFile(processor, FileKind::kConfig));
  }
  return files;
}

Status SetTokenIds(const ResolvedStage& stage, const std::filesystem::path& base_dir,
                   std::string* config_json) {
  const auto options = StageTokenizerOptions(stage);
  if (!options || options->kind() != proto::TokenizerOptions::HF_JSON) return Status::Ok();
  nlohmann::ordered_json config =
      nlohmann::ordered_json::parse(*config_json, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return Status::Ok();
  ENGINE_ASSIGN_OR_RETURN(auto tokenizer, MakeTokenizer(*options, base_dir));
  const auto id = [](int64_t value) {
    return value >= 0 ? nlohmann::ordered_json(value) : nlohmann::ordered_json(nullptr);
  };
  config["bos_token_id"] = id(tokenizer->bos_id());
  config["eos_token_id"] = id(tokenizer->eos_id());
  config["pad_token_id"] = id(tokenizer->pad_id());
  *config_json = config.dump(2);
  return Status::Ok();
}

}  // namespace engine
