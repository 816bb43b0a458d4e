// The plugins known to this process, keyed by (kind, name).
//
//   PluginRegistry registry;
//   registry.LoadSearchPath(PluginSearchPath({"/opt/my-plugins"}));
//   const PluginRegistry::Entry* digits = registry.Find(PluginKind::kDataLoader, "digits");
//
// Two libraries that provide the same (kind, name) are an error naming both; the same library file
// reached twice (say, through two search-path entries) is loaded once. Files in a searched
// directory that cannot be loaded are skipped and remembered, so an "unknown plugin" error can say
// why a plugin the user expected is missing; a library named explicitly (LoadLibrary) fails loudly
// instead.
//
// Ownership: the registry owns the plugin objects; their libraries stay loaded for the whole
// process. Thread safety: load from one thread; after loading, Find and All may be called from any
// thread.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/plugin.h"
#include "engine/status.h"

namespace engine {

class PluginRegistry {
 public:
  struct Entry {
    std::string name;
    PluginKind kind = PluginKind::kDataLoader;
    std::string version;
    std::string description;
    std::filesystem::path library;
    std::unique_ptr<Plugin> plugin;
  };

  // Loads one library and registers its plugin.
  Status LoadLibrary(const std::filesystem::path& path);
  // Loads every "*.so" file in `dir`, in name order. A missing directory is not an error. Returns
  // the first duplicate-registration error; other failures are recorded in skipped().
  Status LoadDirectory(const std::filesystem::path& dir);
  // LoadDirectory for each directory in order.
  Status LoadSearchPath(const std::vector<std::filesystem::path>& dirs);

  // Adds a plugin object directly (for plugins compiled into the caller, and tests).
  Status Register(std::string name, std::string version, std::string description,
                  std::filesystem::path library, std::unique_ptr<Plugin> plugin);

  const Entry* Find(PluginKind kind, std::string_view name) const;
  // All plugins with this name, of any kind.
  std::vector<const Entry*> FindByName(std::string_view name) const;
  // Sorted by kind, then name.
  std::vector<const Entry*> All() const;
  // The model loader that declares `model_type` (ModelLoaderPlugin::model_types). Not found names
  // the type and the types the installed loaders read; two loaders declaring it is an error
  // naming both.
  StatusOr<const Entry*> FindModelLoaderFor(std::string_view model_type) const;
  // Names of the plugins of `kind`, sorted.
  std::vector<std::string> NamesOfKind(PluginKind kind) const;

  // Libraries found in searched directories that could not be loaded, each with the reason.
  const std::vector<std::string>& skipped() const { return skipped_; }

 private:
  std::map<std::pair<PluginKind, std::string>, std::unique_ptr<Entry>> entries_;
  std::vector<std::filesystem::path> loaded_libraries_;
  std::vector<std::string> skipped_;
};

}  // namespace engine
