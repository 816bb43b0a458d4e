// What `check` and `run` share: the plugin registry for the search path, and a pipeline loaded and
// planned from a file, with every error printed as "file:line:col: error: ...".
#pragma once

#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>

#include "pipeline/diagnostics.h"
#include "pipeline/pipeline_loader.h"
#include "plan/pipeline_plan.h"
#include "plugins/plugin_registry.h"

namespace engine::cli {

struct Session {
  PluginRegistry registry;
  std::unique_ptr<ResolvedPipeline> pipeline;
  std::unique_ptr<PipelinePlan> plan;
  Diagnostics diagnostics;
};

// Loads the plugins on the search path (built-in, `plugin_path_flag` split on ':', then
// $ENGINE_PLUGIN_PATH) into `registry`. A duplicate plugin is an error.
Status LoadPluginSearchPath(const std::string& plugin_path_flag, PluginRegistry* registry);

// Loads and validates `file` (session->pipeline), then plans it (session->plan). On failure the
// diagnostics are filled and false is returned.
bool Load(const std::filesystem::path& file, const std::string& plugin_path_flag,
          const LoadOptions& options, Session* session);
bool Plan(Session* session);
bool LoadAndPlan(const std::filesystem::path& file, const std::string& plugin_path_flag,
                 const LoadOptions& options, Session* session);

}  // namespace engine::cli
