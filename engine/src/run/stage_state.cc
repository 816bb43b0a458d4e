#include "run/stage_state.h"

#include <algorithm>
#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_tensors.h"
#include "engine/dtype.h"
#include "engine/safetensors.h"
#include "pipeline/resolved_pipeline.h"

namespace engine {

Status VerifyCheckpointFiles(const std::filesystem::path& dir,
                             const proto::CheckpointManifest& manifest,
                             const std::filesystem::path& base_dir) {
  ENGINE_RETURN_IF_ERROR(VerifyFileDigests(dir, manifest.file()));
  // A sharded stage's ranks' files: every rank's listed (CheckpointTensors::Open below checks the
  // weight files').
  ENGINE_RETURN_IF_ERROR(RankFiles(manifest, RankFile::kOptimizerState).status());
  if (manifest.has_frozen_base()) {
    // A slim checkpoint is only as good as the base it was trained on.
    const proto::FrozenBase& base = manifest.frozen_base();
    ENGINE_RETURN_IF_ERROR(
        VerifyFileDigests(base_dir.empty() ? std::filesystem::path(base.pretrained()) : base_dir,
                          base.file())
            .WithContext("the frozen base it was trained on changed (`engine run` trains "
                         "the stage again)"));
  }
  // model.safetensors, and the tensors a slim checkpoint keeps only in the adapter file (which
  // Open finds there).
  ENGINE_ASSIGN_OR_RETURN(CheckpointTensors weights, CheckpointTensors::Open(dir, manifest));
  const size_t in_model_file = weights.tensors().size() - manifest.adapter_file_tensor_size();
  if (in_model_file != static_cast<size_t>(manifest.tensor_size())) {
    return DataLossError((dir / kModelFile).string() + " holds " + std::to_string(in_model_file) +
                         " tensors; its manifest lists " + std::to_string(manifest.tensor_size()));
  }
  for (const proto::TensorInfo& expected : manifest.tensor()) {
    const safetensors::TensorInfo* info = weights.Find(expected.name());
    const std::vector<int64_t> shape(expected.shape().begin(), expected.shape().end());
    auto dtype = SafetensorsDtypeName(info != nullptr ? info->dtype : at::kFloat);
    if (info == nullptr || info->shape != shape || !dtype || *dtype != expected.dtype()) {
      return DataLossError((dir / kModelFile).string() + ": tensor '" + expected.name() +
                           "' is missing or differs from its manifest");
    }
  }
  if (!manifest.optimizer().state_file().empty()) {
    ENGINE_RETURN_IF_ERROR(
        safetensors::File::Open(dir / manifest.optimizer().state_file()).status());
  }
  return Status::Ok();
}

FinalCheckpointState InspectFinalCheckpoint(const std::filesystem::path& final_dir,
                                            const std::string& fingerprint,
                                            const std::string& parent_run_id,
                                            const std::filesystem::path& base_dir) {
  FinalCheckpointState state;
  std::error_code ec;
  if (!std::filesystem::exists(final_dir / kManifestFile, ec)) {
    state.reason = "no finished checkpoint";
    return state;
  }
  state.found = true;
  StatusOr<proto::CheckpointManifest> manifest = ReadManifest(final_dir);
  if (!manifest.ok()) {
    state.reason = "its checkpoint is unreadable (" + manifest.status().message() + ")";
    return state;
  }
  state.manifest = *manifest;
  if (!manifest->final()) {
    state.reason = "its checkpoint is not a finished one";
  } else if (manifest->parent_run_id() != parent_run_id) {
    // Checked first: the parent's fingerprint is part of this one's, and this is the real news.
    state.reason = "the stage it starts from was trained again since";
  } else if (manifest->fingerprint() != fingerprint) {
    state.reason =
        "its configuration, data, plugins or a stage it comes after changed (fingerprint " +
        manifest->fingerprint() + ", now " + fingerprint + ")";
  } else if (Status files = VerifyCheckpointFiles(final_dir, *manifest, base_dir); !files.ok()) {
    state.damaged = true;
    state.reason = "its checkpoint is damaged (" + files.message() + ")";
  } else {
    state.up_to_date = true;
  }
  return state;
}

std::optional<ResumePoint> FindResumePoint(const std::filesystem::path& stage_dir,
                                           const std::string& fingerprint,
                                           const std::string& parent_run_id,
                                           std::vector<std::string>* notes,
                                           const std::filesystem::path& base_dir,
                                           const std::string& any_world_fingerprint,
                                           std::optional<ResumePoint>* other_schedule) {
  std::vector<std::filesystem::path> dirs = PeriodicCheckpointDirs(stage_dir);
  std::optional<ResumePoint> newest_other;
  // Newest first.
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    const std::filesystem::path& dir = *it;
    StatusOr<proto::CheckpointManifest> manifest = ReadManifest(dir);
    if (!manifest.ok()) {
      notes->push_back(dir.string() + " is unreadable (" + manifest.status().message() + ")");
      continue;
    }
    // Checkpoints of another configuration are not worth a note: they are simply not this run's.
    const bool same = manifest->fingerprint() == fingerprint;
    const bool another_world = !same && !any_world_fingerprint.empty() &&
                               manifest->any_world_fingerprint() == any_world_fingerprint;
    if (!(same || another_world) || manifest->parent_run_id() != parent_run_id ||
        manifest->final()) {
      continue;
    }
    if (manifest->optimizer().state_file().empty()) {
      notes->push_back(dir.string() +
                       " has no optimizer state (checkpoint.save_optimizer_state is off)");
      continue;
    }
    if (Status files = VerifyCheckpointFiles(dir, *manifest, base_dir); !files.ok()) {
      notes->push_back(dir.string() + " is damaged (" + files.message() + ")");
      continue;
    }
    if (another_world) {
      // Named only when no checkpoint of this schedule is found.
      if (!newest_other) newest_other = ResumePoint{dir, *std::move(manifest)};
      continue;
    }
    return ResumePoint{dir, *std::move(manifest)};
  }
  if (other_schedule != nullptr) *other_schedule = std::move(newest_other);
  return std::nullopt;
}

StageDecision DecideStage(const StageSituation& s) {
  StageDecision decision;
  if (s.forced) return decision;
  const std::filesystem::path final_dir = FinalCheckpointDir(s.stage_dir);
  FinalCheckpointState final_state =
      InspectFinalCheckpoint(final_dir, s.fingerprint, s.parent_run_id, s.base_dir);
  bool reuse_as_is = s.before_from && final_state.manifest && final_state.manifest->final();
  if (reuse_as_is && !final_state.up_to_date && !final_state.damaged) {
    // Used although out of date, but never with damaged files.
    if (Status files = VerifyCheckpointFiles(final_dir, *final_state.manifest, s.base_dir);
        !files.ok()) {
      final_state.damaged = true;
      final_state.reason = "its checkpoint is damaged (" + files.message() + ")";
    }
  }
  reuse_as_is = reuse_as_is && !final_state.damaged;
  if (final_state.up_to_date || reuse_as_is) {
    decision.action = StageDecision::Action::kReuse;
    decision.why = final_state.up_to_date
                       ? "up to date (--force=" + s.stage + " trains it again)"
                       : "used as it is (--from=" + s.from + "), although " + final_state.reason;
    decision.manifest = std::move(final_state.manifest);
    return decision;
  }
  if (s.before_from) {
    decision.action = StageDecision::Action::kRefuse;
    decision.refusal =
        FailedPreconditionError(StageSubject(s.stage) + " comes before --from=" + s.from +
                                " but cannot be used as it is: " + final_state.reason + " in " +
                                final_dir.string() + ". Run without --from to train it");
    return decision;
  }
  if (final_state.found) decision.why = final_state.reason;
  std::optional<ResumePoint> other_schedule;
  decision.resume = FindResumePoint(s.stage_dir, s.fingerprint, s.parent_run_id, &decision.notes,
                                    s.base_dir, s.any_world_fingerprint, &other_schedule);
  if (other_schedule && s.another_schedule) {
    decision.action = StageDecision::Action::kRefuse;
    decision.refusal = FailedPreconditionError(s.another_schedule(*other_schedule));
  }
  return decision;
}

}  // namespace engine
