// Where a stage's model reads its weights from: the `pretrained` field of its model loader's
// options (the llama and vlm loaders have one), resolved against the pipeline's directory. Used
// to take the model's own tokenizer by default (the data options' tokenizer field is found here
// too), and to name the base of exported adapters.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>

#include "pipeline/resolved_pipeline.h"

namespace google::protobuf {
class FieldDescriptor;
class Message;
}  // namespace google::protobuf

namespace engine {

// Absolute; empty when the stage's model options have no `pretrained` string or it is empty.
std::filesystem::path StagePretrainedDir(const ResolvedStage& stage,
                                         const std::filesystem::path& base_dir);

// When `model_options` have a `pretrained` directory (resolved against `base_dir`) and `moved_to`
// gives another place for it, sets it to that, and records in `stage` what it was
// (pretrained_as_written, pretrained_moved_from). Returns whether it did.
bool MovePretrainedDir(
    const std::filesystem::path& base_dir,
    const std::function<std::optional<std::filesystem::path>(const std::filesystem::path&)>&
        moved_to,
    google::protobuf::Message& model_options, ResolvedStage* stage);

// Undoes MovePretrainedDir in copies of the stage's model and data options (the `pretrained` value
// as written, and the model's own tokenizer where it was before the move), so that a stage whose
// base moved keeps its fingerprint. Does nothing when the stage's base did not move.
void UndoPretrainedMove(const ResolvedStage& stage, google::protobuf::Message& model_options,
                        google::protobuf::Message& data_options);

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
