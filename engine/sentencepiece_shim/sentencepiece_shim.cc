// libengine_sentencepiece.so: SentencePiece's processor and trainer behind the C table declared in
// src/text/sentencepiece_shim.h (see there for why it is a separate library).
#include "text/sentencepiece_shim.h"

#include <dlfcn.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <iostream>
#include <new>

namespace {

// Under RTLD_DEEPBIND, SentencePiece's references to std::cerr (it logs there) bind to libstdc++'s
// own storage for the stream, while libstdc++ constructed the executable's copy (a copy
// relocation) instead, so the storage seen here was never constructed. When the two differ,
// construct ours over the process's stream buffer; writes then reach the same stderr.
void ConstructStreamsSeenHere() {
  struct Stream {
    std::ostream* here;
    const char* symbol;
  };
  // The program's handle searches the global scope (RTLD_DEFAULT would search ours first).
  void* program = dlopen(nullptr, RTLD_NOW);
  if (program == nullptr) return;
  for (const Stream& s : {Stream{&std::cerr, "_ZSt4cerr"}, Stream{&std::clog, "_ZSt4clog"},
                          Stream{&std::cout, "_ZSt4cout"}}) {
    auto* global = static_cast<std::ostream*>(dlsym(program, s.symbol));
    if (global != nullptr && global != s.here) new (s.here) std::ostream(global->rdbuf());
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

bool Train(const char* flags, std::string* error) {
  const auto status = sentencepiece::SentencePieceTrainer::Train(flags);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

const EngineSentencePieceApi kApi = {Load, Free, Encode, Decode, Info, Train};

}  // namespace

extern "C" __attribute__((visibility("default"))) const EngineSentencePieceApi*
engine_sentencepiece_api() {
  return &kApi;
}
