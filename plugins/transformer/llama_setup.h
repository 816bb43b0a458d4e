// What the `llama` and `vlm` loaders share: checking LlamaOptions, resolving a decoder's sizes from
// options or a pretrained directory and the data, and naming dtypes as config.json does.
#pragma once

#include <filesystem>
#include <string>

#include "engine/data.h"
#include "engine/dtype.h"
#include "engine/plugin.h"
#include "llama_config.h"

namespace engine::transformer {

// Adds errors under `prefix` ("" or "decoder.").
void ValidateLlamaOptions(const LlamaOptions& options, const std::string& prefix,
                          OptionErrors* errors);

struct ResolvedLlama {
  LlamaConfig config;
  std::filesystem::path pretrained_dir;  // empty: random init
};

// Sizes from options (vocab from the data's "input_ids" when vocab_size is 0) or from
// `pretrained`'s config.json. Fails when the data's token ids do not fit the vocabulary.
StatusOr<ResolvedLlama> ResolveLlama(const LlamaOptions& options, const DataSpec* data,
                                     const std::filesystem::path& base_dir);

// True when the data's "labels" are per-token targets (the shape of "input_ids"); otherwise the
// models predict input_ids and ignore "labels" (class labels, say), and this logs why once.
bool UsesTokenLabels(const DataSpec* data);

// True when the data's "labels" mark answers among the tokens (-100 elsewhere, as the chat loader
// makes them: per-token labels that are not class ids), so that exact match of the answers means
// something; false for plain text, whose every token is a label.
bool LabelsMarkAnswers(const DataSpec* data);

// Runs `build` (which allocates the model), turning an allocation failure or other LibTorch error
// into a status instead of an exception.
template <typename Build>
auto GuardModelBuild(Build&& build) -> decltype(build()) {
  try {
    return build();
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("cannot build the model with these sizes: ") +
                                e.what());
  }
}

// Checks that the data's token fields fit `vocab_size`.
Status CheckDataVocab(const DataSpec* data, int64_t vocab_size);

}  // namespace engine::transformer
