// `engine run`: trains the stages of a checked plan in order, each into <output_dir>/<stage>/,
// handing a stage's final weights to the stages that start from it.
//
// A stage whose finished checkpoint is up to date (run/stage_state.h: same fingerprint, started
// from its parent's current weights, files whole) is skipped; a stage interrupted earlier resumes
// from its newest usable periodic checkpoint; any other stage trains from step 0. A stage trained
// in this run makes the stages that start from it out of date.
#pragma once

#include <filesystem>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "engine/checkpoint.pb.h"
#include "plan/pipeline_plan.h"
#include "train/trainer.h"

namespace engine {

struct StageOutcome {
  std::string stage;
  StageResult result;
  // Up to date, or before RunOptions::from: its finished checkpoint was used as it is.
  bool reused = false;
};

struct RunOptions {
  // Stages trained again from step 0 even when up to date (`--force`).
  std::set<std::string> force;
  // `--from`: this stage and every one after it in run order train again from step 0; the stages
  // before it are not trained, their finished checkpoints are used as they are.
  std::string from;
};

// An error naming the stage when `options` names one the pipeline lacks (checked before planning,
// which may load large models).
Status CheckRunOptions(const ResolvedPipeline& pipeline, const RunOptions& options);

// Runs every stage of `plan`; `out` receives what happens to each stage and one summary line per
// stage. Stops at the first stage that fails, with that stage's error (ABORTED after SIGINT or
// SIGTERM, with a checkpoint to resume from).
Status RunPipeline(PipelinePlan* plan, const RunOptions& options, std::ostream& out,
                   std::vector<StageOutcome>* outcomes);

// "stage 'train': 900 steps in 3.1 s; eval loss 0.0912, accuracy 0.9694; checkpoint <dir>".
std::string StageSummary(const std::string& stage, const StageResult& result);

// "stage 'train': eval of 359 examples in 0.2 s: loss 0.0912, accuracy 0.9694 (baseline 0.1000);
// checkpoint <dir>", for `engine eval`.
std::string EvalSummary(const std::string& stage, const StageResult& result);

// "stage 'train': <why>; 900 steps, finished 2026-...; eval: ...; checkpoint <dir>", for a stage
// whose finished checkpoint was used without training.
std::string ReusedStageSummary(const std::string& stage, const std::string& why,
                               const proto::CheckpointManifest& manifest,
                               const std::filesystem::path& dir);

}  // namespace engine
