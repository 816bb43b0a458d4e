#include "pipeline/pretrained_dir.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include "engine/paths.h"
#include "engine/tokenizer.pb.h"

namespace engine {

namespace {

// The model options' singular `pretrained` string field; null when they have none.
const google::protobuf::FieldDescriptor* PretrainedField(const google::protobuf::Message& options) {
  const auto* field = options.GetDescriptor()->FindFieldByName("pretrained");
  if (field == nullptr || field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_STRING ||
      field->is_repeated()) {
    return nullptr;
  }
  return field;
}

}  // namespace

std::filesystem::path StagePretrainedDir(const ResolvedStage& stage,
                                         const std::filesystem::path& base_dir) {
  const google::protobuf::Message* options = stage.model.options.get();
  if (options == nullptr) return {};
  const auto* field = PretrainedField(*options);
  if (field == nullptr) return {};
  const std::string value = options->GetReflection()->GetString(*options, field);
  if (value.empty()) return {};
  return ResolvePath(base_dir, value);
}

bool MovePretrainedDir(
    const std::filesystem::path& base_dir,
    const std::function<std::optional<std::filesystem::path>(const std::filesystem::path&)>&
        moved_to,
    google::protobuf::Message& model_options, ResolvedStage* stage) {
  const auto* field = PretrainedField(model_options);
  if (field == nullptr || !moved_to) return false;
  const std::string value = model_options.GetReflection()->GetString(model_options, field);
  if (value.empty()) return false;
  const std::filesystem::path dir = ResolvePath(base_dir, value).lexically_normal();
  const std::optional<std::filesystem::path> now = moved_to(dir);
  if (!now) return false;
  stage->pretrained_as_written = value;
  stage->pretrained_moved_from = dir;
  model_options.GetReflection()->SetString(&model_options, field, now->string());
  return true;
}

void UndoPretrainedMove(const ResolvedStage& stage, google::protobuf::Message& model_options,
                        google::protobuf::Message& data_options) {
  if (stage.pretrained_as_written.empty()) return;
  const auto* field = PretrainedField(model_options);
  if (field == nullptr) return;
  const std::string moved_to = model_options.GetReflection()->GetString(model_options, field);
  model_options.GetReflection()->SetString(&model_options, field, stage.pretrained_as_written);
  const auto* tokenizer_field = TokenizerOptionsField(data_options);
  if (tokenizer_field == nullptr ||
      !data_options.GetReflection()->HasField(data_options, tokenizer_field)) {
    return;
  }
  google::protobuf::Message* tokenizer =
      data_options.GetReflection()->MutableMessage(&data_options, tokenizer_field);
  const auto* path = tokenizer->GetDescriptor()->FindFieldByName("path");
  if (path != nullptr && tokenizer->GetReflection()->GetString(*tokenizer, path) == moved_to) {
    tokenizer->GetReflection()->SetString(tokenizer, path, stage.pretrained_moved_from.string());
  }
}

const google::protobuf::FieldDescriptor* TokenizerOptionsField(
    const google::protobuf::Message& data_options) {
  const auto* field = data_options.GetDescriptor()->FindFieldByName("tokenizer");
  if (field == nullptr || field->is_repeated() || field->message_type() == nullptr ||
      field->message_type()->full_name() != proto::TokenizerOptions::descriptor()->full_name()) {
    return nullptr;
  }
  return field;
}

bool UseThePretrainedTokenizer(const ResolvedStage& stage, const std::filesystem::path& base_dir,
                               google::protobuf::Message& data_options) {
  const auto* field = TokenizerOptionsField(data_options);
  if (field == nullptr || data_options.GetReflection()->HasField(data_options, field)) {
    return false;
  }
  const std::filesystem::path dir = StagePretrainedDir(stage, base_dir);
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_regular_file(dir / "tokenizer.json", ec)) return false;
  proto::TokenizerOptions tokenizer;
  tokenizer.set_kind(proto::TokenizerOptions::HF_JSON);
  tokenizer.set_path(dir.string());
  // The data loader's library may hold its own copy of the generated class: go through bytes.
  return data_options.GetReflection()
      ->MutableMessage(&data_options, field)
      ->ParseFromString(tokenizer.SerializeAsString());
}

}  // namespace engine
