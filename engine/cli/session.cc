#include "cli/session.h"

#include "checkpoint/checkpoint.h"
#include "plugins/search_path.h"
#include "run/stage_state.h"

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

bool Plan(Session* session, PlanModels models) {
  session->plan = BuildPlan(*session->pipeline, &session->diagnostics, models);
  return session->plan != nullptr;
}

bool LoadAndPlan(const std::filesystem::path& file, const std::string& plugin_path_flag,
                 const LoadOptions& options, Session* session, PlanModels models) {
  return Load(file, plugin_path_flag, options, session) && Plan(session, models);
}

StatusOr<const StagePlan*> FindStagePlan(const PipelinePlan& plan, const std::string& name) {
  if (name.empty() && !plan.stages.empty()) return &plan.stages.back();
  std::string names;
  for (const StagePlan& stage : plan.stages) {
    if (stage.stage->name == name) return &stage;
    names += (names.empty() ? "'" : ", '") + stage.stage->name + "'";
  }
  return NotFoundError("the pipeline has no stage '" + name + "' (its stages: " + names + ")");
}

Status CheckStageCheckpoint(const ResolvedStage& stage, const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return NotFoundError(stage.subject() + ": no checkpoint at '" + dir.string() +
                         "' (train the stage with `engine run`, or name one with --checkpoint)");
  }
  ENGINE_ASSIGN_OR_RETURN(proto::CheckpointManifest manifest, ReadManifest(dir));
  if (manifest.stage() != stage.name) {
    return FailedPreconditionError("'" + dir.string() + "' is a checkpoint of stage '" +
                                   manifest.stage() + "', not of '" + stage.name + "'");
  }
  return VerifyCheckpointFiles(dir, manifest);
}

}  // namespace engine::cli
