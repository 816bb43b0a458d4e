// The plan: for every stage, what will run, checked and counted before step 0.
//
// Building the plan opens each stage's data, builds its model (on the CPU, seeded; for planning
// only, PlanModels), selects the trainable parameters, takes the dtype census and asks the
// precision policy for its plan. Anything that cannot work is reported with its position in the
// pipeline file; what depends on the weights' values (a weight the quantizer refuses) is found when
// the stage's model is built for use. `engine check` prints the plan; `engine run` builds the same
// plan and runs exactly it, reusing the data opened here and building each stage's model, the one
// planned, when the stage trains.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_layout.h"
#include "core/cpu_threads.h"
#include "dist/data_parallel.h"
#include "dist/dist_env.h"
#include "engine/data.h"
#include "engine/model.h"
#include "engine/precision.h"
#include "pipeline/diagnostics.h"
#include "pipeline/resolved_pipeline.h"
#include "plan/handoff.h"
#include "plan/layer_plugins.h"

namespace engine {

struct StagePlan {
  const ResolvedStage* stage = nullptr;

  std::unique_ptr<Dataset> dataset;
  int64_t train_examples = 0;
  int64_t eval_examples = 0;
  // What the dataset says of itself, asked once when planning, behind the plugin guard: printing,
  // fingerprints, manifests and the trainer read these instead of calling the plugin again.
  DataSpec data_spec;
  std::string data_description;
  std::string data_identity;
  std::map<std::string, double> data_baselines;

  std::unique_ptr<Model> model;
  // The model's architecture(), likewise asked once.
  std::string architecture;
  // What the quantizer and adapters did to the model.
  LayerPluginReport layers;
  // What a stage that starts from this one's weights needs of its model (names and shapes), kept
  // apart so that the model itself may be released (PlanModels::kPlanOnly).
  HandoffSource handoff_source;
  // With from_stage: what the stage takes from its parent ("52 tensors copied, ...").
  std::string handoff_summary;
  // With from_stage: the parent's model architecture ("llama"), which may differ from this stage's.
  std::string parent_architecture;
  ParameterCensus census;  // as loaded: parameters then buffers, in module order
  int64_t total_parameters = 0;
  int64_t trainable_parameters = 0;
  int64_t trainable_tensors = 0;

  DeviceCapability device;  // probed
  PrecisionPlan precision;

  // One step = gradient_accumulation_steps micro-batches of batch_size examples on each of
  // world_size ranks (parallel.strategy DDP or SHARDED; 1 otherwise). This process is rank `rank`
  // and trains on shard_examples examples per epoch.
  int64_t world_size = 1;
  int rank = 0;
  int64_t shard_examples = 0;
  DistEnv dist_env;
  // LibTorch's intra-op threads for this stage (core/cpu_threads.h).
  CpuThreadPlan cpu_threads;
  // Whether the stage trains in a c10d process group: a DDP stage with several ranks, or one whose
  // ranks the environment set (torchrun with one process), and the group's backend.
  bool process_group = false;
  DdpBackend backend = DdpBackend::kGloo;
  // parallel.shard_level of a SHARDED stage (0 otherwise): what its ranks split
  // (train/sharded_optimizer.h).
  int shard_level = 0;
  // A SHARDED stage in a process group: its optimizer state and f32 masters are split across the
  // ranks (without a group it trains as one rank, with the whole optimizer).
  bool shards_optimizer() const { return shard_level >= 1 && process_group; }
  // ... and its gradients reduce-scattered, each rank keeping its parts only (shard_level 2).
  bool shards_gradients() const { return shard_level >= 2 && process_group; }
  // ... and the trainable parameters of the model's blocks too, each block gathered while it runs
  // (shard_level 3, dist/parameter_shards.h).
  bool shards_parameters() const { return shard_level >= 3 && process_group; }
  // At shard_level 3: the model's blocks (Model::blocks()), their modules in `model` (in the same
  // order), and the trainable elements they hold, in all and in the largest one.
  std::vector<std::string> blocks;
  std::vector<const torch::nn::Module*> block_modules;
  int64_t block_trainable_elements = 0;
  int64_t largest_block_trainable_elements = 0;
  // DDP's all-reduce buckets (parallel.bucket_mib), in bytes of f32.
  int64_t bucket_bytes = 0;
  // A SHARDED stage's buckets (dist/shard_layout.h), in bytes of the parameters' dtype: the
  // all-gather's pieces and, at level 2, the reduce-scatter's buckets.
  int64_t shard_bucket_bytes = 0;
  int64_t batch_size = 0;
  int64_t gradient_accumulation_steps = 1;
  // Examples per step across all devices, as the data can give them (at most every example of the
  // split in a batch, every batch of an epoch in a step).
  int64_t global_batch = 0;
  // A batch or an accumulation larger than the split: said in the plan.
  std::vector<std::string> schedule_warnings;
  int64_t eval_batch_size = 0;
  int64_t micro_batches_per_epoch = 0;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  double epochs = 0;  // may be fractional under max_steps

  std::string optimizer_summary;
  // Whether its checkpoints hold every tensor or only what it changes, and why.
  CheckpointLayout checkpoint_layout;

  // Hash of the resolved stage (configuration with defaults, plugin versions, data identity, parent
  // fingerprint). For a DDP or SHARDED stage the ranks, per-rank batch size, accumulation and
  // sharding count by the schedule they make (RankSchedule: examples per step and per epoch, steps
  // per epoch) only, so the same
  // stage at another world size with the same schedule has the same fingerprint, is up to date and
  // resumes.
  std::string fingerprint;
  // For a DDP or SHARDED stage, the same without the schedule: equal for this stage at any world
  // size and batch size. Empty for other stages.
  std::string any_world_fingerprint;
  // The examples an epoch trains on, of all ranks (RankSchedule::epoch_examples).
  int64_t epoch_examples = 0;
};

// The schedule a stage's ranks make: every rank takes every world_size-th example of the epoch's
// order, `batch_size` per micro-batch and `accumulation` micro-batches per step (a batch or an
// accumulation larger than the data holds what there is).
struct RankSchedule {
  int64_t shard_examples = 0;  // per rank and epoch
  int64_t micro_batches_per_epoch = 0;
  int64_t steps_per_epoch = 0;  // 0 when an epoch has no batch (drop_last)
  int64_t examples_per_step = 0;
  // Examples an epoch trains on, of all ranks: the first this many of the epoch's order.
  int64_t epoch_examples = 0;
};
RankSchedule ScheduleAt(int64_t train_examples, int64_t world_size, int64_t batch_size,
                        int64_t accumulation, bool drop_last);

struct PipelinePlan {
  const ResolvedPipeline* pipeline = nullptr;
  // In run order.
  std::vector<StagePlan> stages;

  const StagePlan* ForStage(int stage_index) const;
};

// What the plan needs of each stage's model. A model only planned is built without the values no
// plan reads (ModelContext::plan_only: a randomly initialised model draws only the layers its stage
// quantizes, a pretrained one reads the files' headers) and released once planned, so that a
// pipeline of real-size stages is planned in little more memory than one stage's quantized layers.
// The commands that use a model build it when they need it (BuildStageModel).
enum class PlanModels {
  kKeep,      // every stage's model, built for use (`engine run` of one stage)
  kPlanOnly,  // none: `engine check`, and `run` (of several stages), `eval`, `generate` and
              // `export`, which build the models of the stages they use when they use them
};

// Returns nullptr (with diagnostics) when any stage cannot run as written.
std::unique_ptr<PipelinePlan> BuildPlan(const ResolvedPipeline& pipeline, Diagnostics* diagnostics,
                                        PlanModels models = PlanModels::kKeep);

// Builds the model of a stage that was only planned into `plan` (plan->model is null), for use:
// its values drawn or read, its quantizer and adapters applied, its trainable tensors selected, as
// planning does. An error when it cannot be built (what depends on the values: a weight the
// quantizer refuses, the memory the load needs now), or when it is not the model planned (another
// census).
Status BuildStageModel(const ResolvedPipeline& pipeline, StagePlan* plan);

}  // namespace engine
