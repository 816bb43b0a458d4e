#include "text/sentencepiece_shim.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>

namespace engine {
namespace {

// The directory of libengine.so, where libengine_sentencepiece.so sits beside it.
std::filesystem::path OwnDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&SentencePieceShim), &info) == 0 ||
      info.dli_fname == nullptr) {
    return {};
  }
  return std::filesystem::path(info.dli_fname).parent_path();
}

}  // namespace

StatusOr<const EngineSentencePieceApi*> SentencePieceShim() {
  static std::once_flag once;
  static const EngineSentencePieceApi* api = nullptr;
  static std::string error;
  std::call_once(once, [] {
    const auto path = OwnDirectory() / "libengine_sentencepiece.so";
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) {
      const char* why = dlerror();
      error = "cannot open " + path.string() +
              " (SentencePiece support): " + (why != nullptr ? why : "unknown error");
      return;
    }
    using Entry = const EngineSentencePieceApi* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "engine_sentencepiece_api"));
    if (entry == nullptr) {
      error = path.string() + " has no engine_sentencepiece_api";
      return;
    }
    api = entry();  // never closed: processors live as long as the process
  });
  if (api == nullptr) return FailedPreconditionError(error);
  return api;
}

}  // namespace engine
