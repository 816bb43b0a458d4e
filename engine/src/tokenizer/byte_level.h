// GPT-2's byte-to-character map, which byte-level BPE vocabularies are written in: each byte
// becomes one printable character (printable ASCII and Latin-1 bytes stand for themselves; the
// others are shifted to U+0100 and up), so any byte string is a string of visible characters.
//
// Pure functions over constant tables; any thread.
#pragma once

#include <string>
#include <string_view>

namespace engine::tokenizer {

// Each byte of `bytes` as its character, UTF-8 encoded.
std::string BytesToByteLevel(std::string_view bytes);
// The reverse for one token: its characters as bytes. A character outside the map makes the
// whole token come back as its own UTF-8 bytes (tokens that are not byte-level, like added ones).
std::string ByteLevelToBytes(std::string_view token);

}  // namespace engine::tokenizer
