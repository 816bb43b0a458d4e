#include "cli/session.h"

#include "plugins/search_path.h"

namespace engine::cli {

Status LoadPluginSearchPath(const std::string& plugin_path_flag, PluginRegistry* registry) {
  return registry->LoadSearchPath(PluginSearchPath(SplitPathList(plugin_path_flag)));
}

bool Load(const std::filesystem::path& file, const std::string& plugin_path_flag,
          const LoadOptions& options, Session* session) {
  Status status = LoadPluginSearchPath(plugin_path_flag, &session->registry);
  if (!status.ok()) {
    session->diagnostics.Add({file.string(), 0, 0}, status.message());
    return false;
  }
  session->pipeline = LoadPipeline(file, options, &session->registry, &session->diagnostics);
  return session->pipeline != nullptr;
}

bool Plan(Session* session) {
  session->plan = BuildPlan(*session->pipeline, &session->diagnostics);
  return session->plan != nullptr;
}

bool LoadAndPlan(const std::filesystem::path& file, const std::string& plugin_path_flag,
                 const LoadOptions& options, Session* session) {
  return Load(file, plugin_path_flag, options, session) && Plan(session);
}

}  // namespace engine::cli
