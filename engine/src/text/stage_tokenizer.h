// The tokenizer a stage's data loader uses, read from its options: the `tokenizer` field of type
// engine.proto.TokenizerOptions that the text-reading loaders (text, digits_captions, chat) have.
// `engine preview` decodes with it; checkpoints carry its files (and an image processor's) so that
// the next stage, `engine generate` and transformers find them beside the weights.
//
// Pure functions of the resolved stage; any thread.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "engine/status.h"
#include "engine/tokenizer.pb.h"
#include "pipeline/resolved_pipeline.h"

namespace engine {

// Nothing when the loader has no such field.
std::optional<proto::TokenizerOptions> StageTokenizerOptions(const ResolvedStage& stage);

// The image processor's preprocessor_config.json for data read with `tokenizer`: `named` (the
// chat loader's `images { processor }`; empty: none) resolved against `base_dir`, or the one beside
// the tokenizer's config (its `config`, or its tokenizer.json). The file may not exist.
std::filesystem::path ImageProcessorPath(const proto::TokenizerOptions& tokenizer,
                                         const std::string& named,
                                         const std::filesystem::path& base_dir);
// The same for a stage's data; empty when its tokenizer is not HF_JSON.
std::filesystem::path StageImageProcessorPath(const ResolvedStage& stage,
                                              const std::filesystem::path& base_dir);
// The file a stage's data reads its video processor from, as the chat loader does: its
// `videos { processor }` file, or in that directory (default: the tokenizer config's) its
// video_preprocessor_config.json, else its preprocessor_config.json. The file may not exist;
// empty when the stage's tokenizer is not HF_JSON.
std::filesystem::path StageVideoProcessorPath(const ResolvedStage& stage,
                                              const std::filesystem::path& base_dir);
// What a checkpoint or an export carries as video_preprocessor_config.json besides the image
// processor `image`: `video` when it exists and is a video processor's file or another file than
// `image`; empty otherwise (the carried preprocessor_config.json then serves both, as it did).
std::filesystem::path VideoProcessorToCarry(const std::filesystem::path& video,
                                            const std::filesystem::path& image);

// For an HF_JSON tokenizer: "tokenizer.json" and, when there are, "tokenizer_config.json", the
// image processor's preprocessor_config.json (the data's `images.processor`, or the one beside the
// tokenizer's config) and the video processor's video_preprocessor_config.json
// (StageVideoProcessorPath), by file name, with their contents. Empty for other kinds. A file that
// cannot be read is an error naming it.
StatusOr<std::map<std::string, std::string>> StageTokenizerFiles(
    const ResolvedStage& stage, const std::filesystem::path& base_dir);

// For an HF_JSON tokenizer: `config_json` (a model's config.json) with bos_token_id, eos_token_id
// and pad_token_id set to the tokenizer's (null where it has none), so that generation in
// transformers stops where the data taught the model to. Other kinds, or a config that is not a
// JSON object, are left as they are.
Status SetTokenIds(const ResolvedStage& stage, const std::filesystem::path& base_dir,
                   std::string* config_json);

}  // namespace engine
