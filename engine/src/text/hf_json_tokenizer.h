// The engine's Tokenizer over a Hugging Face tokenizer.json (tokenizer/hf_tokenizer.h does the
// work). Its special ids come from tokenizer_config.json (beside the file, or named) when there is
// one (bos_token, eos_token, pad_token, as transformers reads them); otherwise bos is the template
// post-processor's first token, eos is none, and pad is one id past the vocabulary (which grows
// by it, as for SentencePiece models without a pad piece).
//
// Failure: the errors of HfTokenizer::FromFile, and a tokenizer_config.json that does not parse
// or names a special token the tokenizer does not have. Immutable; any thread.
#pragma once

#include <filesystem>
#include <memory>

#include "engine/status.h"
#include "engine/tokenizer.h"

namespace engine {

// `path`: a tokenizer.json, or the directory holding it. `config`: its tokenizer_config.json when
// not beside it (empty: beside it, if there is one).
StatusOr<std::unique_ptr<Tokenizer>> LoadHfJsonTokenizer(const std::filesystem::path& path,
                                                         const std::filesystem::path& config = "");

}  // namespace engine
