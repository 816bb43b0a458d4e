// tokenizer.json's "decoder": how tokens become text again. Supported types: ByteLevel,
// Metaspace, Replace, ByteFallback, Fuse, Strip, WordPiece and Sequence; any other type is an error
// naming it. Without a decoder, tokens are joined with spaces (as the tokenizers crate does).
//
// Immutable after parsing; any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/status.h"
#include "tokenizer/json_fields.h"

namespace engine::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the tokens in place (a step of the chain that ends in concatenation).
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// A null `json` gives nullptr.
StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& json, const std::string& path);

// The text of `tokens`: the decoder's chain, then concatenation (space-joined without one). The
// result is valid UTF-8 (invalid byte runs become U+FFFD).
std::string DecodeTokens(const Decoder* decoder, std::vector<std::string> tokens);

}  // namespace engine::tokenizer
