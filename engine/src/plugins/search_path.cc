#define BOOST_DLL_USE_STD_FS
#include "plugins/search_path.h"

#include <boost/dll/runtime_symbol_info.hpp>
#include <cstdlib>

namespace engine {

std::filesystem::path BuiltinPluginDir() {
  boost::dll::fs::error_code ec;
  std::filesystem::path self = boost::dll::this_line_location(ec);
  if (ec) return {};
  return self.parent_path() / "engine" / "plugins";
}

std::vector<std::filesystem::path> SplitPathList(const std::string& list) {
  std::vector<std::filesystem::path> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(':', start);
    if (end == std::string::npos) end = list.size();
    if (end > start) out.emplace_back(list.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::vector<std::filesystem::path> PluginSearchPath(
    const std::vector<std::filesystem::path>& flag_dirs) {
  std::vector<std::filesystem::path> dirs;
  std::filesystem::path builtin = BuiltinPluginDir();
  if (!builtin.empty()) dirs.push_back(builtin);
  dirs.insert(dirs.end(), flag_dirs.begin(), flag_dirs.end());
  if (const char* env = std::getenv("ENGINE_PLUGIN_PATH")) {
    for (auto& dir : SplitPathList(env)) dirs.push_back(dir);
  }
  return dirs;
}

}  // namespace engine
