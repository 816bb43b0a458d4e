// SentencePiece behind a wall. Debian's libsentencepiece carries its own copy of protobuf-lite 3.14
// and exports those symbols; in a process that also holds the system's libprotobuf (3.21, which
// the engine needs) the dynamic linker binds one library's calls to the other's code and the first
// model load aborts. So SentencePiece lives in its own library, libengine_sentencepiece.so, which
// the engine opens with dlopen(RTLD_LOCAL | RTLD_DEEPBIND): its symbols resolve inside it first.
//
// The functions below are that library's C entry points (the same libstdc++ serves both sides, so
// std types cross safely). `SentencePieceShim()` opens the library once (thread-safe) and returns
// the table, or an error naming the library that could not be opened.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/status.h"

extern "C" {
struct EngineSentencePieceApi {
  // A processor from a serialized model, or null with `error` set.
  void* (*load)(const char* bytes, size_t size, std::string* error);
  void (*free)(void* processor);
  void (*encode)(void* processor, const char* text, size_t size, std::vector<int>* ids);
  void (*decode)(void* processor, const std::vector<int>* ids, std::string* text);
  // piece count, bos, eos, pad (-1 when the model has none)
  void (*info)(void* processor, int* pieces, int* bos, int* eos, int* pad);
};
// The one exported symbol of libengine_sentencepiece.so.
const EngineSentencePieceApi* engine_sentencepiece_api();
}

namespace engine {

StatusOr<const EngineSentencePieceApi*> SentencePieceShim();

}  // namespace engine
