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
#include "run/moved_bases.h"

namespace engine::cli {

struct Session {
  PluginRegistry registry;
  std::unique_ptr<ResolvedPipeline> pipeline;
  std::unique_ptr<PipelinePlan> plan;
  Diagnostics diagnostics;
  // By stage name: the stages whose slim checkpoint's base was found nowhere (run/moved_bases.h).
  std::map<std::string, MovedBaseFinder::Missing> missing_bases;
};

// Loads the plugins on the search path (built-in, `plugin_path_flag` split on ':', then
// $ENGINE_PLUGIN_PATH) into `registry`. A duplicate plugin is an error.
Status LoadPluginSearchPath(const std::string& plugin_path_flag, PluginRegistry* registry);

// Each fills the session's diagnostics and returns false on failure.
// Loads the plugins and reads and validates `file` into session->pipeline. A stage whose slim
// checkpoint's base has moved reads it where `bases` finds it (FindMovedBases), saying so on
// stderr; one found nowhere is recorded in session->missing_bases.
bool Load(const std::filesystem::path& file, const std::string& plugin_path_flag,
          const LoadOptions& options, Session* session, const BaseSearch& bases = {});
// Plans session->pipeline (opens the data, builds the models) into session->plan; `models` says
// whether the plan keeps them.
bool Plan(Session* session, PlanModels models = PlanModels::kKeep);
// Load, then Plan.
bool LoadAndPlan(const std::filesystem::path& file, const std::string& plugin_path_flag,
                 const LoadOptions& options, Session* session,
                 PlanModels models = PlanModels::kKeep, const BaseSearch& bases = {});

// The plan of stage `name` (the last in run order when empty); an error naming the stages there
// are when the pipeline has no such stage.
StatusOr<const StagePlan*> FindStagePlan(const PipelinePlan& plan, const std::string& name);

// An error saying what to do unless `dir` is a whole checkpoint of `stage` of the session's
// pipeline: its manifest names the stage, its files have the sizes and content hashes the manifest
// records, and a slim one's base is in the stage's `pretrained` directory (else the error says
// where the base was looked for).
Status CheckStageCheckpoint(const Session& session, const ResolvedStage& stage,
                            const std::filesystem::path& dir);

}  // namespace engine::cli
