// Opening one plugin library: the manifest check, then registration.
//
// A library is first opened once in a forked child, and its manifest and registration entry points
// called there, because dlopen runs its static initialisers before anything can be checked, some of
// their failures abort the process (protobuf aborts on a second definition of a .proto file or
// message), and an entry point may crash outright. A crash or a hang there is reported as this
// library's error, naming the signal and the step (static initialisers, engine_plugin_manifest(),
// engine_plugin_register()); the registry then skips the library. The probe costs one fork per
// library (no measurable change in `engine plugins` start-up, about 0.6 s with the built-ins).
// ENGINE_PLUGIN_PROBE=0 skips the child (for debuggers).
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
