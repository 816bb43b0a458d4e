// A training stage's side of its checkpoints: what the trainer writes at a periodic or final
// checkpoint, and how it puts a stage back where a periodic checkpoint left it.
//
// A checkpoint holds every parameter and buffer (model.safetensors; a slim one only those outside
// its frozen base, checkpoint/checkpoint_layout.h), the model's config.json, the
// adapters alone as PEFT lays them out, the manifest, and, with optimizer state, everything a
// resume needs to go on exactly: optimizer slots, f32 masters, the loss scaler, the random
// generators of every rank, the callbacks' states and the counters behind the step events
// (training_state.h). A sharded optimizer's slots and masters are in the ranks' own files
// (train/rank_files.h), which a resume at any world size reads its parts from; so are the blocks'
// weights of a shard_level 3 stage's checkpoints (no adapter files are written beside the ranks'
// weights; a stage with adapters writes its final checkpoint whole, with them).
//
// The layout and the atomic publication are checkpoint/checkpoint.h's. Both functions run on the
// training thread and borrow the trainer's parts for the call. Restore checks everything against
// the stage before it changes anything but the weights and optimizer, so a refused checkpoint
// leaves the stage as it was prepared; errors name the checkpoint's directory.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/checkpoint.pb.h"
#include "engine/model.h"
#include "engine/status.h"
#include "train/optimizer.h"
#include "train/precision_runtime.h"
#include "train/rank_files.h"
#include "train/trainer.h"

namespace engine {

// Where training stands; what a resume gives back.
struct TrainingPosition {
  int64_t step = 0;
  int64_t epoch = 0;
  // Examples trained on so far, and the last step's loss and learning rate (for the step events).
  int64_t examples = 0;
  double last_loss = 0;
  double last_lr = 0;
};

// The trainer's parts a checkpoint is taken of.
struct StageParts {
  const StageRunRequest* request = nullptr;
  const StagePlan* plan = nullptr;
  Model* model = nullptr;
  Optimizer* optimizer = nullptr;
  PrecisionRuntime* precision = nullptr;
  at::Device device = at::Device(at::kCPU);
  // The frozen base the stage's checkpoints leave out, its tensors listed
  // (checkpoint/frozen_base.h); null when they hold every tensor.
  const proto::FrozenBase* frozen_base = nullptr;
};

struct CheckpointWrite {
  std::filesystem::path dir;
  bool final = false;
  // Why a final checkpoint's stage stopped before its planned steps; empty when it did not.
  std::string stop_reason;
  std::string run_id;
  // The final evaluation's metrics.
  std::map<std::string, double> metrics;
  bool optimizer_state = false;
  // Under DDP, the other ranks' generator states (GatherRankGenerators).
  std::map<std::string, at::Tensor> rank_generators;
  // A sharded optimizer's state, and at shard_level 3 the blocks' weights, in the ranks' files
  // (train/rank_files.h).
  StagedRankFiles rank_files;
  // The model tensors the ranks' weight files hold (empty: model.safetensors holds them all).
  std::vector<proto::TensorInfo> weights_in_rank_files;
};

Status SaveStageCheckpoint(const StageParts& parts, const TrainingPosition& position,
                           const CheckpointWrite& write);

struct RestoredStage {
  TrainingPosition position;
  // What the callbacks saved, by CallbackRunner key; handed back after stage_begin.
  std::map<std::string, std::string> callback_states;
};

// Restores the weights, optimizer, masters, loss scaler and this rank's random generators from the
// periodic checkpoint in `dir`. `context` ("stage 'x'") begins every error.
StatusOr<RestoredStage> RestoreStageCheckpoint(const StageParts& parts, const std::string& context,
                                               const std::filesystem::path& dir);

}  // namespace engine
