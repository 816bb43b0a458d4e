// Where a stage's model reads its weights from: the `pretrained` field of its model loader's
// options (the llama and vlm loaders have one), resolved against the pipeline's directory. Used
// to take the model's own tokenizer by default (the data options' tokenizer field is found here
// too), and to name the base of exported adapters.
#pragma once

#include <filesystem>

#include "pipeline/resolved_pipeline.h"

namespace google::protobuf {
class FieldDescriptor;
class Message;
}  // namespace google::protobuf

namespace engine {

// Absolute; empty when the stage's model options have no `pretrained` string or it is empty.
std::filesystem::path StagePretrainedDir(const ResolvedStage& stage,
                                         const std::filesystem::path& base_dir);

// The data options' singular `tokenizer` field when it is an engine.proto.TokenizerOptions (as the
// text, chat and digits_captions loaders have); null otherwise.
const google::protobuf::FieldDescriptor* TokenizerOptionsField(
    const google::protobuf::Message& data_options);

// When `data_options` has a `tokenizer` field (engine.proto.TokenizerOptions) left unset and the
// stage's model reads a `pretrained` directory holding tokenizer.json, sets it to that tokenizer
// (HF_JSON, with the directory's tokenizer_config.json): a model's text is its own tokenizer's.
// Returns whether it did. The stage's model options must be bound.
bool UseThePretrainedTokenizer(const ResolvedStage& stage, const std::filesystem::path& base_dir,
                               google::protobuf::Message& data_options);

}  // namespace engine
