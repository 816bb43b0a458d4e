// The manifest of a checkpoint a stage writes: what it is (pipeline, stage, fingerprint, run and
// parent run), where training stood (step, epoch, final or periodic, why it stopped early, the
// metrics) and what wrote it (model, data, precision, quantizer and adapter plugins with versions,
// the precision groups, the engine's and LibTorch's versions). Checks and resumes read it back
// (checkpoint/checkpoint.h).
//
// A pure function of its inputs except for the creation time; any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/checkpoint.pb.h"
#include "plan/pipeline_plan.h"

namespace engine {

struct StageProgress {
  int64_t step = 0;
  int64_t epoch = 0;
  bool final = false;
  std::string stop_reason;  // a final checkpoint of a stage that stopped early
  std::string run_id;
  std::map<std::string, double> metrics;
};

struct StageParent {
  std::string checkpoint;  // empty: the stage started from its model plugin
  std::string run_id;
};

proto::CheckpointManifest StageManifest(const ResolvedPipeline& pipeline, const StagePlan& plan,
                                        const StageParent& parent, const std::string& optimizer,
                                        const std::string& config_json,
                                        const StageProgress& progress);

}  // namespace engine
