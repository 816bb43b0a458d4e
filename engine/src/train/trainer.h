// One stage's training loop: batches, forward, backward, accumulation, clipping, the optimizer
// step, evaluation, checkpoints and callback events, exactly as the stage's plan says.
//
// Counting follows the plan: a step is one optimizer update over gradient_accumulation_steps
// micro-batches; micro-batches are weighted by the number of loss terms they hold, so accumulation
// gives the gradient of the mean over the step's examples. The training order is a deterministic
// shuffle from the stage seed and the epoch.
//
// On failure (a plugin error, a non-finite loss, a FAIL_STAGE callback) the error comes back with
// the stage's context; checkpoints already written stay valid and nothing half-written is left.
// On SIGINT or SIGTERM (core/interrupt.h) the stage stops after the current step, writes a periodic
// checkpoint with optimizer state and returns an ABORTED error naming it.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "plan/pipeline_plan.h"
#include "train/callback_runner.h"
#include "train/step_phases.h"

namespace engine {

struct StageRunRequest {
  const ResolvedPipeline* pipeline = nullptr;
  StagePlan* plan = nullptr;
  // <output_dir>/<stage name>
  std::filesystem::path stage_dir;
  // The stage's callbacks, then the pipeline's; each sees every event of the stage.
  std::vector<CallbackRunner*> callbacks;
  // The final checkpoint of the from_stage parent, empty when the stage starts from its model
  // plugin.
  std::filesystem::path parent_checkpoint;
  // Receives the census after the precision plan is applied; may be null.
  std::ostream* out = nullptr;
  // A periodic checkpoint of this stage, with this plan's fingerprint and optimizer state, to go on
  // from; empty trains from step 0. The weights, optimizer state, f32 masters, loss scaler, random
  // generators and data position are restored, so the stage ends as if it had never stopped.
  std::filesystem::path resume_from;
  // This training's identity (manifest run_id): new for a training from step 0, the resumed
  // checkpoint's when resuming. Empty: one is made up.
  std::string run_id;
  // The run_id of the parent's final checkpoint (manifest parent_run_id), with parent_checkpoint.
  std::string parent_run_id;
};

struct StageResult {
  int64_t steps = 0;
  // The whole stage, and the training steps alone (without the final evaluation and checkpoint).
  double seconds = 0;
  double train_seconds = 0;
  double final_train_loss = 0;
  // "eval/loss", "eval/accuracy", ... from the final evaluation.
  std::map<std::string, double> eval_metrics;
  int64_t eval_examples = 0;
  // What a model that learned nothing scores, by the same names (from the dataset).
  std::map<std::string, double> eval_baselines;
  std::filesystem::path final_checkpoint;
  // Why the stage stopped before its planned steps; empty when it ran them all.
  std::string stop_reason;
  // The step a resumed stage went on from; 0 when it trained from step 0.
  int64_t resumed_from_step = 0;
  // The training steps' time by phase (this process's steps only, after a resume).
  StepPhaseSeconds step_phases;
};

StatusOr<StageResult> TrainStage(const StageRunRequest& request);

// Calls `use` with the stage's model holding the weights of `checkpoint` (as EvaluateStage reads
// them), on the stage's device, in eval mode, inside its precision context; for `engine generate`.
Status WithStageModel(const StageRunRequest& request, const std::filesystem::path& checkpoint,
                      const std::function<Status(Model&)>& use);

// The stage's evaluation on its eval split, with the weights of `checkpoint` (a checkpoint of this
// stage, whose tensors the plan's model has by name and shape), without training: eval_metrics,
// eval_baselines, eval_examples and seconds are set. request.parent_checkpoint, resume_from and
// callbacks are not used.
StatusOr<StageResult> EvaluateStage(const StageRunRequest& request,
                                    const std::filesystem::path& checkpoint);

// A new run_id: time and randomness, hex.
std::string NewRunId();

// The training order of epoch `epoch`: a permutation of [0, n) from `seed`.
std::vector<int64_t> EpochOrder(uint64_t seed, int64_t epoch, int64_t n);

}  // namespace engine
