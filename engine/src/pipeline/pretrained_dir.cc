#include "pipeline/pretrained_dir.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include "engine/paths.h"
#include "engine/tokenizer.pb.h"

namespace engine {

std::filesystem::path StagePretrainedDir(const ResolvedStage& stage,
                                         const std::filesystem::path& base_dir) {
  const google::protobuf::Message* options = stage.model.options.get();
  if (options == nullptr) return {};
  const auto* field = options->GetDescriptor()->FindFieldByName("pretrained");
  if (field == nullptr || field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_STRING ||
      field->is_repeated()) {
    return {};
  }
  const std::string value = options->GetReflection()->GetString(*options, field);
  if (value.empty()) return {};
  return ResolvePath(base_dir, value);
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
