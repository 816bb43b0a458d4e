// What `engine run` finds in a stage's directory before it trains the stage: a finished checkpoint
// that is still up to date (the stage is skipped), the periodic checkpoint of an interrupted
// training to resume from, or nothing it can use (the stage trains from step 0).
//
// A finished checkpoint is up to date when its manifest is readable and final, its fingerprint is
// the stage's fingerprint now, it was started from the parent's current final checkpoint (the
// parent's run_id), and its tensor files are whole (headers parse, sizes match the manifest).
//
// Nothing here writes or deletes.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint.pb.h"
#include "engine/status.h"

namespace engine {

struct FinalCheckpointState {
  // A manifest is there (readable or not).
  bool found = false;
  bool up_to_date = false;
  // Its files failed VerifyCheckpointFiles (checked only when everything else is up to date).
  bool damaged = false;
  // Why it is not, for the log: "no finished checkpoint", "its configuration changed", ...
  std::string reason;
  // When the manifest could be read.
  std::optional<proto::CheckpointManifest> manifest;
};

// `final_dir` is <output_dir>/<stage>/final. `parent_run_id` is the run_id of the from_stage
// parent's final checkpoint, empty for a stage without one. `base_dir`: the stage's `pretrained`
// directory, where a slim checkpoint's base is checked (VerifyCheckpointFiles).
FinalCheckpointState InspectFinalCheckpoint(const std::filesystem::path& final_dir,
                                            const std::string& fingerprint,
                                            const std::string& parent_run_id,
                                            const std::filesystem::path& base_dir = {});

struct ResumePoint {
  std::filesystem::path dir;
  proto::CheckpointManifest manifest;
};

// The newest periodic checkpoint in <stage_dir>/checkpoints/ that this stage can go on from: same
// fingerprint, same parent run, optimizer state saved, files whole. `notes` receives one line per
// newer checkpoint passed over, saying why. Where there is none, the newest that would do but for
// its fingerprint and has `any_world_fingerprint` (non-empty: this DDP or SHARDED stage on
// another schedule, at another world size or batch size) goes into `other_schedule` (when not
// null).
std::optional<ResumePoint> FindResumePoint(const std::filesystem::path& stage_dir,
                                           const std::string& fingerprint,
                                           const std::string& parent_run_id,
                                           std::vector<std::string>* notes,
                                           const std::filesystem::path& base_dir = {},
                                           const std::string& any_world_fingerprint = {},
                                           std::optional<ResumePoint>* other_schedule = nullptr);

// What `engine run` does with a stage, and why: decided from what its directory holds and the
// command line.
struct StageDecision {
  enum class Action {
    kReuse,  // its finished checkpoint is used as it is
    kTrain,  // train it: from `resume` when set, else from step 0
    kRefuse  // it comes before --from but its finished checkpoint cannot be used, or its newest
             // periodic checkpoint is of another schedule: `refusal`
  };
  Action action = Action::kTrain;
  // kReuse: "up to date (...)" or "used as it is (--from=x), although ...", for the summary line.
  // kTrain: why a finished checkpoint that was found is trained again; empty when none was found.
  std::string why;
  // kReuse: the finished checkpoint's manifest.
  std::optional<proto::CheckpointManifest> manifest;
  std::optional<ResumePoint> resume;
  // Newer periodic checkpoints passed over on the way to `resume`, each with why.
  std::vector<std::string> notes;
  Status refusal;
};

struct StageSituation {
  std::string stage;
  std::filesystem::path stage_dir;  // <output_dir>/<stage>
  // Its `pretrained` directory (empty when none): where its slim checkpoints' base is checked.
  std::filesystem::path base_dir;
  std::string fingerprint;
  // The run_id of the from_stage parent's final checkpoint; empty for a stage without one.
  std::string parent_run_id;
  // --force names it, or it is --from's stage or comes after it: trains from step 0.
  bool forced = false;
  // --from names a later stage: its finished checkpoint is used as it is, or the run is refused.
  bool before_from = false;
  std::string from;  // --from's stage, for the messages
  // Its fingerprint without the schedule across ranks (StagePlan::any_world_fingerprint; empty
  // but for DDP and SHARDED stages), and the refusal's message for a periodic checkpoint with it
  // but another schedule (another world size, batch size or accumulation), with the way out: such a
  // stage never silently starts over from step 0.
  std::string any_world_fingerprint;
  std::function<std::string(const ResumePoint&)> another_schedule;
};

StageDecision DecideStage(const StageSituation& situation);

// Checks that every file of the checkpoint in `dir` has the size and content hash its manifest
// records, and that the tensor files are whole and hold what `manifest` lists (names, dtypes,
// shapes); the optimizer file, when the manifest names one, must open too. A slim checkpoint's
// frozen base (its `pretrained` files) is checked likewise, in `base_dir` (the reader's own
// `pretrained` directory, where a moved base was found) or, when that is empty, where the manifest
// recorded it.
Status VerifyCheckpointFiles(const std::filesystem::path& dir,
                             const proto::CheckpointManifest& manifest,
                             const std::filesystem::path& base_dir = {});

}  // namespace engine
