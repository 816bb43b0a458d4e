// What every command that reads a pipeline shares (check, run, eval, preview, and generate and
// export through run/generation_source.h): the plugin registry for the search path, and a pipeline
// loaded and planned from a file, every error in its diagnostics as "file:line:col: error: ...".
// The command line prints the diagnostics and the notes; nothing here prints.
//
// Use from one thread; the session owns what it loads.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/diagnostics.h"
#include "pipeline/pipeline_loader.h"
#include "plan/pipeline_plan.h"
#include "plugins/plugin_registry.h"
#include "run/moved_bases.h"

namespace engine {

struct PipelineSession {
  PluginRegistry registry;
  std::unique_ptr<ResolvedPipeline> pipeline;
  std::unique_ptr<PipelinePlan> plan;
  Diagnostics diagnostics;
  // By stage name: the stages whose slim checkpoint's base was found nowhere (run/moved_bases.h).
  std::map<std::string, MovedBaseFinder::Missing> missing_bases;
  // What loading found that the user should hear (a moved base read from where it was found).
  std::vector<std::string> notes;
};

// Loads the plugins on the search path (built-in, `plugin_path_flag` split on ':', then
// $ENGINE_PLUGIN_PATH) into `registry`. A duplicate plugin is an error.
Status LoadPluginSearchPath(const std::string& plugin_path_flag, PluginRegistry* registry);

// Each fills the session's diagnostics and returns false on failure.
// Loads the plugins and reads and validates `file` into session->pipeline. A stage whose slim
// checkpoint's base has moved reads it where `bases` finds it (FindMovedBases), saying so in
// session->notes; one found nowhere is recorded in session->missing_bases.
bool LoadSession(const std::filesystem::path& file, const std::string& plugin_path_flag,
                 const LoadOptions& options, PipelineSession* session,
                 const BaseSearch& bases = {});
// Plans session->pipeline (opens the data, builds the models) into session->plan; `models` says
// whether the plan keeps them.
bool PlanSession(PipelineSession* session, PlanModels models = PlanModels::kPlanOnly);
// Load, then Plan.
bool LoadAndPlanSession(const std::filesystem::path& file, const std::string& plugin_path_flag,
                        const LoadOptions& options, PipelineSession* session,
                        PlanModels models = PlanModels::kPlanOnly, const BaseSearch& bases = {});

// The plan of stage `name` (the last in run order when empty); an error naming the stages there
// are when the pipeline has no such stage.
StatusOr<const StagePlan*> FindStagePlan(const PipelinePlan& plan, const std::string& name);

// FindStagePlan's stage, with its model built for use (BuildStageModel) when planning left it out:
// for the commands that use one stage's model (eval, generate, export), which plan with
// PlanModels::kPlanOnly so that the other stages' models are never held.
StatusOr<StagePlan*> StagePlanWithModel(PipelineSession* session, const std::string& name);

// An error saying what to do unless `dir` is a whole checkpoint of `stage` of the session's
// pipeline: its manifest names the stage, its files have the sizes and content hashes the manifest
// records, and a slim one's base is in the stage's `pretrained` directory (else the error says
// where the base was looked for).
Status CheckStageCheckpoint(const PipelineSession& session, const ResolvedStage& stage,
                            const std::filesystem::path& dir);

}  // namespace engine
