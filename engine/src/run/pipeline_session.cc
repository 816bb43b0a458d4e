#include "run/pipeline_session.h"

#include <memory>

#include "checkpoint/checkpoint.h"
#include "pipeline/pretrained_dir.h"
#include "plugins/search_path.h"
#include "run/stage_state.h"

namespace engine {

Status LoadPluginSearchPath(const std::string& plugin_path_flag, PluginRegistry* registry) {
  return registry->LoadSearchPath(PluginSearchPath(SplitPathList(plugin_path_flag)));
}

namespace {

// A base that is gone fails its model's checks or build: the diagnostics say where it was looked
// for, and which hashes it has.
void ReportMissingBases(PipelineSession* session) {
  for (const auto& [stage, missing] : session->missing_bases) {
    session->diagnostics.Add(missing.model, missing.why.message());
  }
}

}  // namespace

bool LoadSession(const std::filesystem::path& file, const std::string& plugin_path_flag,
                 const LoadOptions& options, PipelineSession* session, const BaseSearch& bases) {
  Status status = LoadPluginSearchPath(plugin_path_flag, &session->registry);
  if (!status.ok()) {
    session->diagnostics.Add({file.string(), 0, 0}, status.message());
    return false;
  }
  auto finder = std::make_shared<MovedBaseFinder>(bases);
  LoadOptions finding = options;
  finding.find_moved_base = [finder](const ResolvedPipeline& pipeline, const ResolvedStage& stage,
                                     const std::filesystem::path& dir) {
    return finder->Find(pipeline, stage, dir);
  };
  session->pipeline = LoadPipeline(file, finding, &session->registry, &session->diagnostics);
  session->notes = finder->notes();
  session->missing_bases = finder->not_found();
  if (session->pipeline == nullptr) ReportMissingBases(session);
  return session->pipeline != nullptr;
}

bool PlanSession(PipelineSession* session, PlanModels models) {
  session->plan = BuildPlan(*session->pipeline, &session->diagnostics, models);
  if (session->plan == nullptr) ReportMissingBases(session);
  return session->plan != nullptr;
}

bool LoadAndPlanSession(const std::filesystem::path& file, const std::string& plugin_path_flag,
                        const LoadOptions& options, PipelineSession* session, PlanModels models,
                        const BaseSearch& bases) {
  return LoadSession(file, plugin_path_flag, options, session, bases) &&
         PlanSession(session, models);
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

StatusOr<StagePlan*> StagePlanWithModel(PipelineSession* session, const std::string& name) {
  ENGINE_ASSIGN_OR_RETURN(const StagePlan* found, FindStagePlan(*session->plan, name));
  // The session owns the plan; FindStagePlan hands out const pointers for the readers.
  StagePlan* plan = const_cast<StagePlan*>(found);
  if (plan->model == nullptr) ENGINE_RETURN_IF_ERROR(BuildStageModel(*session->pipeline, plan));
  return plan;
}

Status CheckStageCheckpoint(const PipelineSession& session, const ResolvedStage& stage,
                            const std::filesystem::path& dir) {
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
  Status verified =
      VerifyCheckpointFiles(dir, manifest, StagePretrainedDir(stage, session.pipeline->base_dir));
  auto missing = session.missing_bases.find(stage.name);
  if (verified.ok() || !manifest.has_frozen_base() || missing == session.missing_bases.end()) {
    return verified;
  }
  return Status(verified.code(), verified.message() + ". " + missing->second.why.message());
}

}  // namespace engine
