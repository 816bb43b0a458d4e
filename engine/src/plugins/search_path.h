// Where plugin libraries are looked for, in order: the built-in plugin directory, the directories
// given with --plugin_path, then those in $ENGINE_PLUGIN_PATH (':'-separated). A pipeline may add
// its own `plugin_path` entries after these.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace engine {

// `<directory of libengine.so>/engine/plugins`, both in the build tree and once installed.
std::filesystem::path BuiltinPluginDir();

// Splits "a:b::c" into {"a", "b", "c"}.
std::vector<std::filesystem::path> SplitPathList(const std::string& list);

std::vector<std::filesystem::path> PluginSearchPath(
    const std::vector<std::filesystem::path>& flag_dirs);

}  // namespace engine
