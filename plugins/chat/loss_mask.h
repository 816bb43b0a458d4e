// A rendered conversation as token ids with the tokens that carry loss marked: those of the
// assistant spans (ChatTemplate::RenderForTraining), end-of-turn tokens included.
//
// The whole text is encoded at once, so the ids are those inference sees (encoding turn by turn
// would tokenize the seams differently), up to a limit past which the text is not encoded. Which
// token covers which text is found by decoding prefixes of the ids (binary search per span edge): a
// token carries loss when its text overlaps an assistant span. Decoders that add or drop spaces
// (SentencePiece's leading space) are aligned to the rendered text by skipping the spaces one side
// has and the other lacks.
//
// Failure: decoded text that differs from the rendering beyond spaces (a normalizer that rewrote
// it) is an error, never a guessed mask. Pure; any thread (the tokenizer is immutable).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "engine/status.h"
#include "engine/tokenizer.h"

namespace engine::plugins {

struct TokenizedConversation {
  std::vector<int64_t> ids;
  std::vector<uint8_t> loss;  // 1: the token carries loss
};

// At most `max_tokens` ids: the first ones of the whole text's, found without encoding the rest
// (Tokenizer::EncodeAtMost), with the loss of each as the whole text gives it. (When the cut falls
// inside a run of byte tokens whose decoding is not the text's, the whole text is encoded.)
StatusOr<TokenizedConversation> TokenizeForTraining(const chat::RenderedConversation& rendered,
                                                    const Tokenizer& tokenizer, size_t max_tokens);

}  // namespace engine::plugins
