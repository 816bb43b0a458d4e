#include "cli/session.h"

#include <iostream>
#include <memory>

#include "checkpoint/checkpoint.h"
#include "pipeline/pretrained_dir.h"
#include "plugins/search_path.h"
#include "run/stage_state.h"

namespace engine::cli {

Status LoadPluginSearchPath(const std::string& plugin_path_flag, PluginRegistry* registry) {
  return registry->LoadSearchPath(PluginSearchPath(SplitPathList(plugin_path_flag)));
}

namespace {

// A base that is gone fails its model's checks or build: the diagnostics say where it was looked
// for, and which hashes it has.
void ReportMissingBases(Session* session) {
  for (const auto& [stage, missing] : session->missing_bases) {
    session->diagnostics.Add(missing.model, missing.why.message());
  }
}

}  // namespace

bool Load(const std::filesystem::path& file, const std::string& plugin_path_flag,
          const LoadOptions& options, Session* session, const BaseSearch& bases) {
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
  for (const std::string& note : finder->notes()) std::cerr << "engine: " << note << "\n";
  session->missing_bases = finder->not_found();
  if (session->pipeline == nullptr) ReportMissingBases(session);
  return session->pipeline != nullptr;
}

bool Plan(Session* session, PlanModels models) {
  session->plan = BuildPlan(*session->pipeline, &session->diagnostics, models);
  if (session->plan == nullptr) ReportMissingBases(session);
  return session->plan != nullptr;
}

bool LoadAndPlan(const std::filesystem::path& file, const std::string& plugin_path_flag,
                 const LoadOptions& options, Session* session, PlanModels models,
                 const BaseSearch& bases) {
  return Load(file, plugin_path_flag, options, session, bases) && Plan(session, models);
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

Status CheckStageCheckpoint(const Session& session, const ResolvedStage& stage,
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

}  // namespace engine::cli
