// libengine_sentencepiece.so: SentencePiece's processor behind the C table declared in
// src/text/sentencepiece_shim.h (see there for why it is a separate library).
#include "text/sentencepiece_shim.h"

#include <dlfcn.h>
#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstring>
#include <ext/stdio_sync_filebuf.h>
#include <iostream>
#include <new>

namespace {

// Under RTLD_DEEPBIND, SentencePiece's references to std::cerr (it logs there) bind to libstdc++'s
// own storage for the stream, while libstdc++ may have constructed the executable's copy (a copy
// relocation) instead, so the storage seen here was never constructed and the first log line
// crashes. Storage that was never constructed is still all zeros (no vtable pointer): construct
// such a stream here, over the process's stream buffer when the program's copy is a different
// object, else over a buffer of its own on the same file descriptor.
bool Constructed(const std::ostream* stream) {
  const void* vtable = nullptr;
  std::memcpy(&vtable, static_cast<const void*>(stream), sizeof(vtable));
  return vtable != nullptr;
}

void ConstructStreamsSeenHere() {
  struct Stream {
    std::ostream* here;
    const char* symbol;
    FILE* file;
  };
  // The program's handle searches the global scope (RTLD_DEFAULT would search ours first).
  void* program = dlopen(nullptr, RTLD_NOW);
  for (const Stream& s :
       {Stream{&std::cerr, "_ZSt4cerr", stderr}, Stream{&std::clog, "_ZSt4clog", stderr},
        Stream{&std::cout, "_ZSt4cout", stdout}}) {
    if (Constructed(s.here)) continue;
    auto* global =
        program != nullptr ? static_cast<std::ostream*>(dlsym(program, s.symbol)) : nullptr;
    std::streambuf* buffer = global != nullptr && global != s.here && Constructed(global)
                                 ? global->rdbuf()
                                 : new __gnu_cxx::stdio_sync_filebuf<char>(s.file);
    new (s.here) std::ostream(buffer);
  }
}

const bool kStreamsConstructed = (ConstructStreamsSeenHere(), true);

void* Load(const char* bytes, size_t size, std::string* error) {
  auto* processor = new sentencepiece::SentencePieceProcessor();
  const auto status = processor->LoadFromSerializedProto(std::string_view(bytes, size));
  if (!status.ok()) {
    *error = status.ToString();
    delete processor;
    return nullptr;
  }
  return processor;
}

void Free(void* processor) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(processor);
}

void Encode(void* processor, const char* text, size_t size, std::vector<int>* ids) {
  ids->clear();
  static_cast<sentencepiece::SentencePieceProcessor*>(processor)
      ->Encode(std::string_view(text, size), ids)
      .IgnoreError();
}

void Decode(void* processor, const std::vector<int>* ids, std::string* text) {
  text->clear();
  static_cast<sentencepiece::SentencePieceProcessor*>(processor)->Decode(*ids, text).IgnoreError();
}

void Info(void* processor, int* pieces, int* bos, int* eos, int* pad) {
  const auto* p = static_cast<sentencepiece::SentencePieceProcessor*>(processor);
  *pieces = p->GetPieceSize();
  *bos = p->bos_id();
  *eos = p->eos_id();
  *pad = p->pad_id();
}

const EngineSentencePieceApi kApi = {Load, Free, Encode, Decode, Info};

}  // namespace

extern "C" __attribute__((visibility("default"))) const EngineSentencePieceApi*
engine_sentencepiece_api() {
  return &kApi;
}
