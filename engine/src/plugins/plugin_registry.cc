#include "plugins/plugin_registry.h"

#include <algorithm>
#include <set>
#include <system_error>

#include "engine/model.h"
#include "plugins/plugin_library.h"

namespace engine {

Status PluginRegistry::Register(std::string name, std::string version, std::string description,
                                std::filesystem::path library, std::unique_ptr<Plugin> plugin) {
  if (plugin == nullptr)
    return InvalidArgumentError("cannot register a null plugin '" + name + "'");
  const PluginKind kind = plugin->kind();
  auto key = std::make_pair(kind, name);
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    return AlreadyExistsError("the " + std::string(PluginKindTitle(kind)) + " plugin '" + name +
                              "' is provided by two libraries: '" + it->second->library.string() +
                              "' and '" + library.string() +
                              "'; remove one of them from the plugin path");
  }
  auto entry = std::make_unique<Entry>();
  entry->name = std::move(name);
  entry->kind = kind;
  entry->version = std::move(version);
  entry->description = std::move(description);
  entry->library = std::move(library);
  entry->plugin = std::move(plugin);
  entries_.emplace(std::move(key), std::move(entry));
  return Status::Ok();
}

Status PluginRegistry::LoadLibrary(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path canonical = std::filesystem::weakly_canonical(path, ec);
  if (ec) canonical = path;
  if (std::find(loaded_libraries_.begin(), loaded_libraries_.end(), canonical) !=
      loaded_libraries_.end()) {
    return Status::Ok();
  }
  ENGINE_ASSIGN_OR_RETURN(LoadedPlugin loaded, LoadPluginLibrary(path));
  loaded_libraries_.push_back(canonical);
  return Register(std::move(loaded.name), std::move(loaded.version), std::move(loaded.description),
                  std::move(loaded.library), std::move(loaded.plugin));
}

Status PluginRegistry::LoadDirectory(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return Status::Ok();
  std::vector<std::filesystem::path> files;
  for (const auto& item : std::filesystem::directory_iterator(dir, ec)) {
    if (item.path().extension() == ".so") files.push_back(item.path());
  }
  std::sort(files.begin(), files.end());
  Status first_duplicate;
  for (const auto& file : files) {
    Status status = LoadLibrary(file);
    if (status.code() == StatusCode::kAlreadyExists) {
      if (first_duplicate.ok()) first_duplicate = status;
    } else if (!status.ok()) {
      skipped_.push_back(status.message());
    }
  }
  return first_duplicate;
}

Status PluginRegistry::LoadSearchPath(const std::vector<std::filesystem::path>& dirs) {
  Status first_error;
  for (const auto& dir : dirs) {
    Status status = LoadDirectory(dir);
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  return first_error;
}

const PluginRegistry::Entry* PluginRegistry::Find(PluginKind kind, std::string_view name) const {
  auto it = entries_.find(std::make_pair(kind, std::string(name)));
  return it == entries_.end() ? nullptr : it->second.get();
}

StatusOr<const PluginRegistry::Entry*> PluginRegistry::FindModelLoaderFor(
    std::string_view model_type) const {
  std::vector<const Entry*> found;
  std::set<std::string> known;
  for (const auto& [key, entry] : entries_) {
    if (key.first != PluginKind::kModelLoader) continue;
    for (const std::string& type :
         static_cast<const ModelLoaderPlugin&>(*entry->plugin).model_types()) {
      known.insert(type);
      if (type == model_type) found.push_back(entry.get());
    }
  }
  if (found.size() > 1) {
    return FailedPreconditionError("the model loaders '" + found[0]->name + "' and '" +
                                   found[1]->name + "' both read model_type '" +
                                   std::string(model_type) + "'; remove one from the plugin path");
  }
  if (found.empty()) {
    std::string list;
    for (const std::string& type : known) list += (list.empty() ? "" : ", ") + type;
    return NotFoundError("no installed model loader reads model_type '" + std::string(model_type) +
                         "' (the installed ones read " + (list.empty() ? "none" : list) +
                         "; see `engine plugins`)");
  }
  return found.front();
}

std::vector<const PluginRegistry::Entry*> PluginRegistry::FindByName(std::string_view name) const {
  std::vector<const Entry*> out;
  for (const auto& [key, entry] : entries_) {
    if (key.second == name) out.push_back(entry.get());
  }
  return out;
}

std::vector<const PluginRegistry::Entry*> PluginRegistry::All() const {
  std::vector<const Entry*> out;
  for (const auto& [key, entry] : entries_) out.push_back(entry.get());
  return out;
}

std::vector<std::string> PluginRegistry::NamesOfKind(PluginKind kind) const {
  std::vector<std::string> out;
  for (const auto& [key, entry] : entries_) {
    if (key.first == kind) out.push_back(key.second);
  }
  return out;
}

}  // namespace engine
