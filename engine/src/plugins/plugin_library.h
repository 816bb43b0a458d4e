// Opening one plugin library: the manifest check, then registration.
//
// A library is first opened once in a forked child, because dlopen runs its static initialisers
// before anything can be checked, and some of their failures abort the process (protobuf aborts on
// a second definition of a .proto file or message). A crash there is reported as this library's
// error. ENGINE_PLUGIN_PROBE=0 skips the child (for debuggers).
//
// The manifest is read and compared with this engine (API version, LibTorch version, C++ ABI,
// protobuf version) before any C++ symbol of the library is used. Every failure is a Status naming
// the library and what is wrong with it; nothing the library does (a missing symbol, a throwing
// factory) can crash the caller. Libraries are never unloaded: the handle is kept for the life of
// the process, since plugin objects, option descriptors and vtables live inside them.
//
// Thread safety: call from one thread at a time (dlopen itself is thread-safe; registration order
// is not).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "engine/plugin.h"
#include "engine/status.h"

namespace engine {

struct LoadedPlugin {
  // Canonical path of the library.
  std::filesystem::path library;
  std::string name;
  PluginKind kind = PluginKind::kDataLoader;
  std::string version;
  std::string description;
  std::unique_ptr<Plugin> plugin;
};

StatusOr<LoadedPlugin> LoadPluginLibrary(const std::filesystem::path& path);

}  // namespace engine
