#include "train/trainer.h"

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/frozen_base.h"
#include "core/allocator.h"
#include "core/block_runner.h"
#include "core/cpu_threads.h"
#include "core/guarded_call.h"
#include "core/interrupt.h"
#include "core/logging.h"
#include "core/remove_tree.h"
#include "dist/data_parallel.h"
#include "dist/eval_partials.h"
#include "dist/gradient_sync.h"
#include "dist/parameter_shards.h"
#include "engine/adapter.h"
#include "engine/format.h"
#include "engine/json_text.h"
#include "engine/linear.h"
#include "plan/handoff.h"
#include "plan/plan_printer.h"
#include "precision/census.h"
#include "train/batch_prefetcher.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"
#include "train/parent_weights.h"
#include "train/precision_runtime.h"
#include "train/rank_agreement.h"
#include "train/stage_checkpoint.h"
#include "train/stage_optimizer.h"
#include "train/step_scalars.h"
#include "train/training_state.h"

namespace engine {
namespace {

using Clock = std::chrono::steady_clock;

// fp16 overflows in this many consecutive steps stop the stage instead of training nothing.
constexpr int64_t kMaxConsecutiveSkips = 30;

// A collective that waits longer than this for another rank fails (that rank is gone or stuck).
constexpr int kCollectiveTimeoutSeconds = 300;

std::set<std::string> HostFieldsOf(const Model& model) {
  const std::vector<std::string> fields = model.host_fields();
  return {fields.begin(), fields.end()};
}

class StageTrainer : public CallbackActions {
 public:
  explicit StageTrainer(const StageRunRequest& request)
      : request_(request),
        plan_(*request.plan),
        stage_(*plan_.stage),
        config_(*stage_.config),
        model_(*plan_.model),
        module_(model_.module()),
        device_(stage_.device.device),
        host_fields_(HostFieldsOf(model_)),
        context_(stage_.subject()),
        frozen_base_(stage_, *request.pipeline, plan_.checkpoint_layout.slim) {}

  // CallbackActions: requests take effect once the current event has been delivered.
  void RequestStop(const std::string& reason) override {
    if (stop_reason_.empty()) stop_reason_ = reason.empty() ? "a callback asked to stop" : reason;
  }
  void RequestCheckpoint() override { checkpoint_requested_ = true; }

  // The stage's evaluation with the weights of `checkpoint` (one of this stage's), without
  // training: the weights are read by name as a parent's are, then placed and cast as for training.
  StatusOr<StageResult> EvaluateOnly(const std::filesystem::path& checkpoint) {
    start_ = Clock::now();
    ENGINE_RETURN_IF_ERROR(LoadParentWeights(module_, ParentLoadOf(checkpoint)).status());
    ENGINE_RETURN_IF_ERROR(PlaceAndApplyPrecision());
    ApplyThreadCount();
    StageResult result;
    ENGINE_ASSIGN_OR_RETURN(result.eval_metrics, Evaluate());
    for (const auto& [metric, value] : plan_.data_baselines) {
      result.eval_baselines["eval/" + metric] = value;
    }
    result.eval_examples = plan_.eval_examples;
    result.final_checkpoint = checkpoint;
    result.seconds = Seconds();
    return result;
  }

  // The stage's model with the weights of `checkpoint`, placed and cast as for training, in eval
  // mode, handed to `use` inside the stage's precision context.
  Status WithPreparedModel(const std::filesystem::path& checkpoint,
                           const std::function<Status(Model&)>& use) {
    ENGINE_RETURN_IF_ERROR(LoadParentWeights(module_, ParentLoadOf(checkpoint)).status());
    ENGINE_RETURN_IF_ERROR(PlaceAndApplyPrecision());
    ApplyThreadCount();
    module_.eval();
    return GuardedCall(stage_.model.context, [&] {
      auto scope = precision_->context().Enter();
      return use(model_);
    });
  }

  // The stage as named steps: set up, go back to a periodic checkpoint if resuming, announce the
  // stage, train to its last step (or an early stop), then evaluate, save and announce the end.
  StatusOr<StageResult> Run() {
    start_ = Clock::now();
    run_id_ = request_.run_id.empty() ? NewRunId() : request_.run_id;
    ENGINE_RETURN_IF_ERROR(Prepare());
    // Dropout and other randomness while training draw from generators seeded from the stage seed
    // when the stage starts, so a stage trains the same whether the stages before it ran or were up
    // to date; every DDP rank has its own stream (independent dropout masks).
    at::manual_seed(TrainingSeed(stage_.seed, plan_.rank));
    if (!request_.resume_from.empty()) ENGINE_RETURN_IF_ERROR(Restore());
    const int64_t resumed_from_step = step_;
    ENGINE_RETURN_IF_ERROR(BeginStage());
    ENGINE_RETURN_IF_ERROR(TrainToTheEnd());
    return FinishStage(resumed_from_step);
  }

 private:
  Status Prepare() {
    const bool has_parent = !request_.parent_checkpoint.empty();
    std::set<std::string> parent_base;
    if (has_parent) {
      ParentLoad load = ParentLoadOf(request_.parent_checkpoint);
      load.merge_adapters = config_.parent_adapters() == proto::Stage::MERGE;
      load.new_tensor_globs = {config_.new_tensors().begin(), config_.new_tensors().end()};
      // What the stage's adapters' files gave it is its own; its own checkpoints (read by
      // ParentLoadOf too) are not its parent's.
      load.child_own_tensors = plan_.layers.adapter_saved_tensors;
      ENGINE_ASSIGN_OR_RETURN(parent_base, LoadParentWeights(module_, load));
    }
    ENGINE_RETURN_IF_ERROR(PlaceAndApplyPrecision());
    ENGINE_RETURN_IF_ERROR(
        frozen_base_
            .Fix(module_, has_parent ? &parent_base : nullptr, plan_.layers.adapter_saved_tensors)
            .WithContext(context_));
    ENGINE_RETURN_IF_ERROR(ConnectRanks());
    ENGINE_RETURN_IF_ERROR(MakeOptimizerAndGradientSync());
    ENGINE_RETURN_IF_ERROR(precision_->VerifyOptimizerState(*optimizer_).WithContext(context_));
    ApplyThreadCount();
    return Status::Ok();
  }

  // How the stage's checkpoint `dir` (or its parent's) is read into the model.
  ParentLoad ParentLoadOf(const std::filesystem::path& dir) {
    ParentLoad load;
    load.dir = dir;
    load.context = context_;
    load.architecture = plan_.architecture;
    load.child_adapter_parameters = plan_.layers.adapter_parameters;
    load.own_base = [this] { return frozen_base_.Identity(); };
    return load;
  }

  // The model on the stage's device under its precision plan (printing the census).
  Status PlaceAndApplyPrecision() {
    ENGINE_RETURN_IF_ERROR(GuardedCall(context_, [&] {
      ENGINE_RETURN_IF_ERROR(PrecisionRuntime::CastStorage(plan_.precision, module_));
      module_.to(device_);
      return Status::Ok();
    }));
    ENGINE_ASSIGN_OR_RETURN(precision_, GuardedCall(context_, [&] {
                              return PrecisionRuntime::Apply(plan_.precision, module_, device_,
                                                             plan_.shards_optimizer()
                                                                 ? MasterHolder::kOptimizer
                                                                 : MasterHolder::kRuntime);
                            }));
    for (const std::string& warning : plan_.precision.warnings) {
      LOG(WARNING) << context_ << ": " << warning;
    }
    if (request_.out != nullptr) {
      *request_.out << context_ << " starts: " << plan_.precision.policy << " applied ("
                    << precision_->context().ToString()
                    << (precision_->loss_scaling()
                            ? ", loss scale " + FormatNumber(precision_->loss_scale())
                            : std::string())
                    << "); census now:\n"
                    << CensusText(TakeCensus(module_), "    ", &plan_.precision) << std::flush;
    }
    return Status::Ok();
  }

  // Under DDP: the process group and the ranks' agreement that they run the same stage.
  Status ConnectRanks() {
    if (plan_.process_group) {
      ENGINE_ASSIGN_OR_RETURN(data_parallel_,
                              DataParallel::Connect(plan_.dist_env, plan_.backend, device_,
                                                    std::chrono::seconds(kCollectiveTimeoutSeconds))
                                  .WithContext(context_));
      ENGINE_RETURN_IF_ERROR(
          AgreeOnTheStage(
              *data_parallel_,
              StageAgreementEntries(
                  config_, stage_.path(),
                  {{"the data " + stage_.path() + " reads", plan_.data_identity},
                   {stage_.path() + "'s plugins and precision plan", plan_.fingerprint}}))
              .WithContext(context_));
    }
    return Status::Ok();
  }

  // The optimizer and the gradient sync the plan's strategy asks for (train/stage_optimizer.h).
  Status MakeOptimizerAndGradientSync() {
    if (plan_.shards_parameters()) large_blocks_from_mmap_.emplace(kShardLevelThreeMmapBytes);
    ENGINE_ASSIGN_OR_RETURN(StageOptimizer made, MakeStageOptimizer(plan_, config_.optimizer(),
                                                                    *precision_, data_parallel_)
                                                     .WithContext(context_));
    optimizer_ = std::move(made.optimizer);
    gradient_sync_ = std::move(made.gradient_sync);
    parameter_shards_ = std::move(made.parameter_shards);
    block_runner_ = std::make_unique<ScopedBlockRunner>(parameter_shards_.get());
    return Status::Ok();
  }

  // Runs `use` with the model's parameters whole on every rank: at shard_level 3 (a collective)
  // for what reads or writes them all (a restore, an evaluation the model cannot run block by
  // block); else as it is.
  Status WithWholeParameters(const std::function<Status()>& use) {
    if (parameter_shards_ == nullptr) return use();
    return GuardedCall(context_, [&] { return parameter_shards_->WithWholeParameters(use); });
  }

  void ApplyThreadCount() { ApplyCpuThreads(plan_.cpu_threads); }

  Status BeginStage() {
    Event begin = MakeEvent(EventType::kStageBegin);
    if (HasCallbacks()) begin.plan_json = JsonText(StagePlanToJson(*request_.pipeline, plan_));
    ENGINE_RETURN_IF_ERROR(Emit(begin));
    // After stage_begin, which callbacks take as their cue to start afresh.
    RestoreCallbackStates(request_.callbacks, restored_callback_states_);
    restored_callback_states_.clear();
    module_.train();
    return Status::Ok();
  }

  // This rank's micro-batches of the current epoch, in training order, without the first `skip`.
  std::vector<std::vector<int64_t>> MicroBatchesOfEpoch(size_t skip) {
    const int64_t n = plan_.shard_examples;
    const int64_t batch = plan_.batch_size;
    std::vector<int64_t> order = EpochOrder(stage_.seed, epoch_, plan_.train_examples);
    if (plan_.world_size > 1) {
      // This rank's shard: every world_size-th example, the same count on every rank.
      for (int64_t i = 0; i < n; ++i) order[i] = order[i * plan_.world_size + plan_.rank];
      order.resize(static_cast<size_t>(n));
    }
    std::vector<std::vector<int64_t>> micro_batches;
    for (int64_t begin = 0; begin < n; begin += batch) {
      const int64_t end = std::min(n, begin + batch);
      if (config_.schedule().drop_last() && end - begin < batch) break;
      micro_batches.emplace_back(order.begin() + begin, order.begin() + end);
    }
    micro_batches.erase(
        micro_batches.begin(),
        micro_batches.begin() + static_cast<std::ptrdiff_t>(std::min(skip, micro_batches.size())));
    return micro_batches;
  }

  // Steps until the plan's last one or a stop request; an interruption returns its ABORTED error.
  Status TrainToTheEnd() {
    const size_t accumulation = static_cast<size_t>(plan_.gradient_accumulation_steps);
    // A resumed stage goes on inside its epoch: every step but an epoch's last takes `accumulation`
    // micro-batches.
    size_t skip = static_cast<size_t>(step_ - epoch_ * plan_.steps_per_epoch) * accumulation;
    while (step_ < plan_.total_steps && stop_reason_.empty()) {
      // Under DDP the ranks agree after every step instead (a rank alone must not leave).
      if (plan_.world_size == 1 && InterruptRequested()) return Interrupted();
      const std::vector<std::vector<int64_t>> micro_batches = MicroBatchesOfEpoch(skip);
      skip = 0;
      BatchPrefetcher prefetcher(*plan_.dataset, Split::kTrain, micro_batches, stage_.data.context,
                                 LoaderStepDevice());
      for (size_t first = 0;
           first < micro_batches.size() && step_ < plan_.total_steps && stop_reason_.empty();
           first += accumulation) {
        ENGINE_RETURN_IF_ERROR(
            TrainStep(prefetcher, first, std::min(micro_batches.size(), first + accumulation)));
        ENGINE_RETURN_IF_ERROR(AfterStep());
      }
      ++epoch_;
    }
    if (!stop_reason_.empty()) {
      LOG(WARNING) << context_ << ": stopping after step " << step_ << " of " << plan_.total_steps
                   << ": " << stop_reason_;
    }
    return Status::Ok();
  }

  // What is due between steps: an evaluation, a periodic checkpoint, an interruption. The last step
  // leaves its evaluation and checkpoint to FinishStage.
  Status AfterStep() {
    if (step_ == plan_.total_steps) return Status::Ok();
    const uint64_t eval_every = config_.schedule().eval_every_steps();
    if (eval_every > 0 && step_ % eval_every == 0) {
      ENGINE_RETURN_IF_ERROR(EvaluateAndReport().status());
    }
    // Under DDP the ranks first agree on stopping and on a checkpoint a callback asked for
    // (callbacks run on rank 0), since saving gathers from every rank.
    ENGINE_ASSIGN_OR_RETURN(const bool interrupted, AgreeOnStopping());
    const uint64_t checkpoint_every = config_.schedule().checkpoint_every_steps();
    const bool due = checkpoint_every > 0 && step_ % checkpoint_every == 0;
    if (stop_reason_.empty() && (due || checkpoint_requested_)) {
      checkpoint_requested_ = false;
      ENGINE_RETURN_IF_ERROR(SavePeriodicCheckpoint());
    }
    if (interrupted) return Interrupted();
    return Status::Ok();
  }

  // The final evaluation and checkpoint, and the stage_end event.
  StatusOr<StageResult> FinishStage(int64_t resumed_from_step) {
    StageResult result;
    result.train_seconds = Seconds();
    result.steps = step_;
    result.resumed_from_step = resumed_from_step;
    result.step_phases = phases_;
    result.stop_reason = stop_reason_;
    result.final_train_loss = last_loss_;
    ENGINE_RETURN_IF_ERROR(EvaluateAndSaveFinal(result));
    // The stages after this one read its final checkpoint on every rank.
    if (data_parallel_ != nullptr) ENGINE_RETURN_IF_ERROR(data_parallel_->Barrier());
    result.seconds = Seconds();
    Event end = MakeEvent(EventType::kStageEnd);
    end.metrics = result.eval_metrics;
    end.path = result.final_checkpoint.string();
    end.message = stop_reason_.empty() ? "finished" : "stopped early: " + stop_reason_;
    end.memory = ReadMemoryStats();
    ENGINE_RETURN_IF_ERROR(Emit(end));
    return result;
  }

  // The final evaluation and checkpoint, into `result`. At shard_level 3 the checkpoint holds the
  // ranks' parts of the blocks' weights, unless the stage trains adapters: they are then what it
  // trains (its base stays whole on every rank), so gathering them costs little, and whole they go
  // into PEFT's adapter_model.safetensors too, which a stage that merges them reads.
  Status EvaluateAndSaveFinal(StageResult& result) {
    ENGINE_ASSIGN_OR_RETURN(result.eval_metrics, EvaluateAndReport());
    for (const auto& [metric, value] : plan_.data_baselines) {
      result.eval_baselines["eval/" + metric] = value;
    }
    result.eval_examples = plan_.eval_examples;
    if (plan_.stage->adapters.empty()) return SaveFinal(result);
    return WithWholeParameters([&] { return SaveFinal(result); });
  }

  Status SaveFinal(StageResult& result) {
    result.final_checkpoint = FinalCheckpointDir(request_.stage_dir);
    CheckpointWrite write = NewCheckpointWrite(result.final_checkpoint, /*final=*/true);
    write.stop_reason = stop_reason_;
    write.metrics = result.eval_metrics;
    ENGINE_RETURN_IF_ERROR(WriteOwnParts(write));
    ENGINE_RETURN_IF_ERROR(SaveOnRankZero(write));
    if (plan_.rank == 0) RemoveOtherRunsCheckpoints(request_.stage_dir, run_id_, context_);
    return Status::Ok();
  }

  // Whether to stop for a signal; under DDP also spreads a stop or a checkpoint that rank 0's
  // callbacks asked for, so every rank leaves the loop, or saves, after the same step.
  StatusOr<bool> AgreeOnStopping() {
    if (data_parallel_ == nullptr) return InterruptRequested();
    ENGINE_ASSIGN_OR_RETURN(
        std::vector<double> flags,
        data_parallel_
            ->Max({InterruptRequested() ? 1.0 : 0.0, stop_reason_.empty() ? 0.0 : 1.0,
                   checkpoint_requested_ ? 1.0 : 0.0})
            .WithContext(context_));
    if (flags[1] > 0 && stop_reason_.empty()) stop_reason_ = "rank 0's callbacks asked to stop";
    checkpoint_requested_ = flags[2] > 0;
    return flags[0] > 0;
  }

  // After SIGINT or SIGTERM: a checkpoint to resume from (unless no step was taken), then stop.
  Status Interrupted() {
    const std::string signal = InterruptSignalName();
    // The same decision on every rank (saving gathers from all of them): last_checkpoint_step_ is
    // kept on every rank, the list of directories only on rank 0.
    if (step_ == 0 || last_checkpoint_step_ == step_) {
      const std::string saved = step_ == 0 ? "; nothing to save"
                                : !periodic_.empty()
                                    ? "; checkpoint " + periodic_.back().string()
                                    : "; the checkpoint of step " + std::to_string(step_);
      return AbortedError(context_ + ": interrupted by " + signal + " at step " +
                          std::to_string(step_) + " of " + std::to_string(plan_.total_steps) +
                          saved + ". Run the same command again to go on from there");
    }
    ENGINE_RETURN_IF_ERROR(SavePeriodicCheckpoint(/*force_optimizer_state=*/true));
    const std::string where = plan_.rank == 0 ? "; checkpoint " + periodic_.back().string()
                                              : "; rank 0 saved a checkpoint";
    return AbortedError(context_ + ": interrupted by " +
                        (signal.empty() ? std::string("a signal to another rank") : signal) +
                        " after step " + std::to_string(step_) + " of " +
                        std::to_string(plan_.total_steps) + where +
                        ". Run the same command again to resume from it");
  }

  // Puts the stage back where request_.resume_from left it (train/stage_checkpoint.h).
  Status Restore() {
    RestoredStage restored;
    ENGINE_RETURN_IF_ERROR(WithWholeParameters([&]() -> Status {
      ENGINE_ASSIGN_OR_RETURN(restored,
                              RestoreStageCheckpoint(Parts(), context_, request_.resume_from));
      return Status::Ok();
    }));
    step_ = restored.position.step;
    epoch_ = restored.position.epoch;
    examples_ = restored.position.examples;
    last_loss_ = restored.position.last_loss;
    last_lr_ = restored.position.last_lr;
    restored_callback_states_ = std::move(restored.callback_states);
    last_checkpoint_step_ = step_;
    // This training's own periodic checkpoints, oldest first, so keep_last counts them too.
    periodic_ = PeriodicCheckpointsOfRun(request_.stage_dir, run_id_, step_);
    LOG(INFO) << context_ << ": resumed at step " << step_ << " of " << plan_.total_steps
              << " (epoch " << epoch_ << ") from " << request_.resume_from.string();
    return Status::Ok();
  }

  StepDevice LoaderStepDevice() const {
    return device_.is_cpu() ? StepDevice::kCpu : StepDevice::kAccelerator;
  }

  // The next batch from `prefetcher`, on the stage's device.
  StatusOr<Batch> NextBatch(BatchPrefetcher& prefetcher) {
    PhaseTimer timer(&phases_.batch);
    ENGINE_ASSIGN_OR_RETURN(Batch batch, prefetcher.Next());
    if (device_.is_cpu()) return batch;
    for (auto& [name, tensor] : batch) {
      if (host_fields_.count(name) == 0) tensor = tensor.to(device_, /*non_blocking=*/true);
    }
    return batch;
  }

  StatusOr<ModelOutput> ForwardInContext(const Batch& batch) {
    PhaseTimer timer(&phases_.forward);
    return GuardedCall(stage_.model.context, [&]() -> StatusOr<ModelOutput> {
      auto scope = precision_->context().Enter();
      return model_.Forward(batch);
    });
  }

  // What the micro-batches of one step gave: the summed loss and its number of terms, those the
  // models counted on the host and those they left on the device (read with the step's other
  // scalars).
  struct AccumulatedLoss {
    at::Tensor sum;
    int64_t count = 0;
    at::Tensor device_count;
  };

  // One optimizer step over micro-batches [first, last) of the epoch, taken from `prefetcher`.
  // Micro-batches are weighted by their numbers of loss terms and the gradients divided by the
  // total (known after the step's read), so that the step follows the mean over all of its terms,
  // on all ranks. A single micro-batch on one rank is that mean already, and is not weighted.
  Status TrainStep(BatchPrefetcher& prefetcher, size_t first, size_t last) {
    precision_->ZeroGrad();
    const bool data_parallel = gradient_sync_ != nullptr;
    const bool weighted = last - first > 1 || data_parallel;
    const double scale = precision_->loss_scale();
    ENGINE_ASSIGN_OR_RETURN(AccumulatedLoss accumulated,
                            AccumulateGradients(prefetcher, first, last, scale, weighted));
    // At shard_level 3 a block gathered ahead and not run keeps reading the slices the update
    // writes; every rank waits for it here.
    if (parameter_shards_ != nullptr) {
      ENGINE_RETURN_IF_ERROR(parameter_shards_->Settle().WithContext(context_));
    }
    RankSums ranks;
    if (data_parallel) {
      // Every rank ends with the same (still loss-scaled) gradients, so all of them see the same
      // overflow and skip the same steps.
      ENGINE_RETURN_IF_ERROR(gradient_sync_->Finish().WithContext(context_));
      ENGINE_ASSIGN_OR_RETURN(ranks, AverageOverRanks(accumulated));
    }
    ENGINE_ASSIGN_OR_RETURN(const StepScalars read,
                            PrepareAndReadGradients(accumulated, ranks, weighted));
    if (read.divisor == 0) {
      return FailedPreconditionError(context_ + ": step " + std::to_string(step_ + 1) +
                                     " had no loss terms (every example was masked)");
    }
    const double loss = read.loss_sum / read.divisor;
    if (!std::isfinite(loss)) {
      return FailedPreconditionError(
          context_ + ": the training loss became " + std::to_string(loss) + " at step " +
          std::to_string(step_ + 1) + " (" + plan_.precision.policy +
          "); the weights were not updated. Lower optimizer.learning_rate or set "
          "optimizer.max_grad_norm" +
          (plan_.precision.autocast ? std::string(", or compute in a wider dtype") : ""));
    }
    ENGINE_ASSIGN_OR_RETURN(double grad_norm, UpdateWeights(read, scale));
    if (large_blocks_from_mmap_ && large_blocks_from_mmap_->applied()) ReturnFreedMemory();
    ++step_;
    examples_ += read.count;
    last_loss_ = loss;
    return EmitStepEnd(loss, grad_norm);
  }

  // Under DDP: the ranks' summed losses and counts of loss terms, each averaged over the ranks (on
  // the device, not read). The averaged gradients divided by that count follow the mean over every
  // term of every rank, so the ranks stay equal however unevenly their examples are masked, and
  // every rank reports (and judges) the same loss.
  struct RankSums {
    at::Tensor loss_sum, count;
  };
  StatusOr<RankSums> AverageOverRanks(const AccumulatedLoss& accumulated) {
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(data_parallel_->device());
    at::Tensor sums = at::zeros({2}, f32);
    if (accumulated.sum.defined()) sums[0].copy_(accumulated.sum);
    sums[1].fill_(static_cast<double>(accumulated.count));
    if (accumulated.device_count.defined()) sums[1].add_(accumulated.device_count);
    ENGINE_RETURN_IF_ERROR(data_parallel_->StartSum(sums)->Wait().WithContext(context_));
    sums.div_(static_cast<double>(data_parallel_->world_size()));
    return RankSums{sums[0], sums[1]};
  }

  // What a step reads from the device, in one copy (train/step_scalars.h), and what follows.
  struct StepScalars {
    double loss_sum = 0;  // this rank's, or under DDP the ranks' mean
    int64_t count = 0;    // this rank's loss terms, host and device counts together
    bool finite = true;
    double grad_norm = -1;  // -1: not computed (no clipping, or gradients not finite)
    // What the gradients are still to be divided by (and the loss sum, for the step's mean): the
    // step's count (under DDP the ranks' mean count) where micro-batches were weighted, else 1;
    // 0 when no micro-batch had a loss term. grad_norm is already divided.
    double divisor = 1;
  };

  // Unscales the gradients by the loss scale, queues their non-finite flag and, where the stage
  // clips, their norm, and reads those with the loss and the counts left on the device in one
  // synchronisation.
  // With gradients in parts (shard_level 2), each rank checks and measures its parts only, and
  // the flag and the squared norm are summed over the ranks (on the device) before the read.
  StatusOr<StepScalars> PrepareAndReadGradients(const AccumulatedLoss& accumulated,
                                                const RankSums& ranks, bool weighted) {
    at::Tensor flag, norm_squared;
    {
      PhaseTimer timer(&phases_.update);
      flag = precision_->UnscaleAndFlag();
      if (config_.optimizer().max_grad_norm() > 0) norm_squared = precision_->GradNormSquared();
      if (plan_.shards_gradients()) {
        ENGINE_ASSIGN_OR_RETURN(std::tie(flag, norm_squared),
                                SumFlagAndNormOverRanks(flag, norm_squared));
      }
    }
    PhaseTimer timer(&phases_.host_read);
    const at::Tensor& loss_sum = ranks.loss_sum.defined() ? ranks.loss_sum : accumulated.sum;
    const std::vector<double> values =
        ReadStepScalars({loss_sum, flag, norm_squared, accumulated.device_count, ranks.count});
    StepScalars read;
    read.loss_sum = loss_sum.defined() ? values[0] : 0;
    read.count = accumulated.count;
    if (accumulated.device_count.defined()) read.count += static_cast<int64_t>(values[3]);
    if (ranks.count.defined()) {
      read.divisor = values[4];
    } else if (weighted || read.count == 0) {
      read.divisor = static_cast<double>(read.count);
    }
    read.finite = values[1] == 0;
    if (read.finite && norm_squared.defined() && read.divisor > 0) {
      read.grad_norm = std::sqrt(values[2]) / read.divisor;
    }
    return read;
  }

  // `flag` and `norm_squared` (undefined: none) each summed over the ranks, in f64.
  StatusOr<std::pair<at::Tensor, at::Tensor>> SumFlagAndNormOverRanks(
      const at::Tensor& flag, const at::Tensor& norm_squared) {
    const auto f64 = at::TensorOptions().dtype(at::kDouble).device(data_parallel_->device());
    at::Tensor sums = at::zeros({2}, f64);
    sums[0].copy_(flag);
    if (norm_squared.defined()) sums[1].copy_(norm_squared);
    ENGINE_RETURN_IF_ERROR(data_parallel_->StartSum(sums)->Wait().WithContext(context_));
    return std::make_pair(sums[0], norm_squared.defined() ? sums[1] : at::Tensor());
  }

  // Forward and backward over each micro-batch; `weighted`: each micro-batch's mean loss
  // multiplied by its number of loss terms.
  StatusOr<AccumulatedLoss> AccumulateGradients(BatchPrefetcher& prefetcher, size_t first,
                                                size_t last, double scale, bool weighted) {
    AccumulatedLoss accumulated;
    for (size_t i = first; i < last; ++i) {
      ENGINE_ASSIGN_OR_RETURN(Batch batch, NextBatch(prefetcher));
      ENGINE_ASSIGN_OR_RETURN(ModelOutput output, ForwardInContext(batch));
      // A count on the device is not known here: its micro-batch runs even when it holds no
      // terms (its loss is then 0, and so are its gradients).
      const at::Tensor& device_count = output.loss_count_tensor;
      if (parameter_shards_ != nullptr && !device_count.defined()) {
        ENGINE_RETURN_IF_ERROR(AgreeEveryRankRunsTheBackward(output.loss_count));
      }
      if (!device_count.defined() && output.loss_count <= 0) continue;
      if (gradient_sync_ != nullptr && i + 1 == last) gradient_sync_->ArmForLastBackward();
      PhaseTimer timer(&phases_.backward);
      ENGINE_RETURN_IF_ERROR(GuardedCall(context_, [&] {
        at::Tensor term_sum = output.loss;
        if (weighted) {
          term_sum = device_count.defined() ? output.loss * device_count
                                            : output.loss * static_cast<double>(output.loss_count);
        }
        (scale != 1.0 ? term_sum * scale : term_sum).backward();
        accumulated.sum =
            accumulated.sum.defined() ? accumulated.sum + term_sum.detach() : term_sum.detach();
        return Status::Ok();
      }));
      if (device_count.defined()) {
        accumulated.device_count = accumulated.device_count.defined()
                                       ? accumulated.device_count + device_count
                                       : device_count;
      } else {
        accumulated.count += output.loss_count;
      }
    }
    return accumulated;
  }

  // At shard_level 3 each backward gathers every block again, a collective: a rank may not skip
  // one that another rank runs. A micro-batch counted on the host with no loss terms on any rank
  // (which the other levels skip) is refused on every rank alike.
  Status AgreeEveryRankRunsTheBackward(int64_t loss_count) {
    ENGINE_ASSIGN_OR_RETURN(
        std::vector<double> none,
        data_parallel_->Max({loss_count <= 0 ? 1.0 : 0.0}).WithContext(context_));
    if (none[0] == 0) return Status::Ok();
    return FailedPreconditionError(
        context_ + ": a micro-batch of step " + std::to_string(step_ + 1) +
        " held no loss terms on some rank, and at shard_level 3 every rank runs every backward "
        "(its "
        "blocks are gathered for it): have the model count its terms on the device "
        "(ModelOutput::loss_count_tensor), or train at shard_level 2");
  }

  // Clips and steps the optimizer when the step's gradients are finite; skips the step (fp16 with
  // loss scaling) or fails when they are not. Returns the gradient norm, or -1 when it was not
  // computed.
  StatusOr<double> UpdateWeights(const StepScalars& read, double scale) {
    PhaseTimer timer(&phases_.update);
    const bool finite = read.finite;
    if (finite) {
      precision_->ApplyClip(read.grad_norm, config_.optimizer().max_grad_norm(), read.divisor);
      const double lr = LearningRateAt(config_.optimizer(), step_, plan_.total_steps);
      ENGINE_RETURN_IF_ERROR(GuardedCall(context_, [&] {
        precision_->Step(*optimizer_, lr);
        return Status::Ok();
      }));
      last_lr_ = lr;
    } else if (!precision_->loss_scaling()) {
      return FailedPreconditionError(context_ + ": the gradients became non-finite at step " +
                                     std::to_string(step_ + 1) + " (" + plan_.precision.policy +
                                     "); the weights were not updated. Lower "
                                     "optimizer.learning_rate or set optimizer.max_grad_norm");
    } else {
      LOG(WARNING) << context_ << ": step " << step_ + 1 << " overflowed at loss scale "
                   << FormatNumber(scale) << "; skipped (weights unchanged), scale now "
                   << FormatNumber(scale * plan_.precision.loss_scaling.backoff_factor);
    }
    precision_->UpdateScale(!finite);
    if (precision_->consecutive_skipped_steps() >= kMaxConsecutiveSkips) {
      return FailedPreconditionError(
          context_ + ": " + std::to_string(kMaxConsecutiveSkips) +
          " steps in a row overflowed in fp16 even at loss scale " +
          FormatNumber(precision_->loss_scale()) +
          "; the gradients do not fit fp16. Use bf16-mixed (where the device has bf16) or fp32");
    }
    return read.grad_norm;
  }

  Status EmitStepEnd(double loss, double grad_norm) {
    if (!HasCallbacks()) return Status::Ok();
    PhaseTimer timer(&phases_.callbacks);
    Event event = MakeEvent(EventType::kStepEnd);
    event.metrics = {
        {"loss", loss}, {"lr", last_lr_}, {"examples", static_cast<double>(examples_)}};
    if (grad_norm >= 0) event.metrics["grad_norm"] = grad_norm;
    if (precision_->loss_scaling()) {
      event.metrics["loss_scale"] = precision_->loss_scale();
      event.metrics["skipped_steps"] = static_cast<double>(precision_->skipped_steps());
    }
    AddStepPhaseSeconds(&event.metrics);
    event.memory = ReadMemoryStats();
    return Emit(event);
  }

  // This step's seconds by phase ("seconds/forward", ...), so that metrics.jsonl and TensorBoard
  // show where each step's time went; the callbacks' own time is the previous step's.
  void AddStepPhaseSeconds(std::map<std::string, double>* metrics) {
    const StepPhaseSeconds& now = phases_;
    const StepPhaseSeconds& before = phases_at_last_step_end_;
    (*metrics)["seconds/batch"] = now.batch - before.batch;
    (*metrics)["seconds/forward"] = now.forward - before.forward;
    (*metrics)["seconds/backward"] = now.backward - before.backward;
    (*metrics)["seconds/host_read"] = now.host_read - before.host_read;
    (*metrics)["seconds/update"] = now.update - before.update;
    (*metrics)["seconds/callbacks"] = now.callbacks - before.callbacks;
    phases_at_last_step_end_ = phases_;
  }

  // Under DDP each rank evaluates every world_size-th batch and the partial sums are added up, so
  // evaluation takes 1/world_size of the time; all ranks end with the same metrics.
  StatusOr<std::map<std::string, double>> Evaluate() {
    if (plan_.eval_examples == 0) return std::map<std::string, double>();
    const std::vector<std::vector<int64_t>> batches = EvalBatches();
    const size_t ranks = static_cast<size_t>(plan_.world_size);
    if (data_parallel_ != nullptr && batches.size() >= ranks) {
      std::vector<std::vector<int64_t>> mine;
      for (size_t b = static_cast<size_t>(plan_.rank); b < batches.size(); b += ranks) {
        mine.push_back(batches[b]);
      }
      LOG(INFO) << context_ << ": rank " << plan_.rank << " evaluates " << mine.size() << " of "
                << batches.size() << " eval batches";
      // At shard_level 3 every rank makes as many forwards as the rank with the most batches.
      const size_t forwards =
          parameter_shards_ != nullptr ? (batches.size() + ranks - 1) / ranks : mine.size();
      ENGINE_ASSIGN_OR_RETURN(EvalPartials partials, EvaluateBatches(mine, forwards));
      ENGINE_ASSIGN_OR_RETURN(const bool summed, SumOverRanks(*data_parallel_, partials));
      if (summed) return partials.Values();
      LOG(WARNING) << context_
                   << ": the ranks' evaluations returned different metric names, so every rank "
                      "evaluates the whole split instead";
    }
    ENGINE_ASSIGN_OR_RETURN(EvalPartials partials, EvaluateBatches(batches, batches.size()));
    return partials.Values();
  }

  // The eval split's examples in batches of eval_batch_size.
  std::vector<std::vector<int64_t>> EvalBatches() const {
    const int64_t n = plan_.eval_examples;
    std::vector<std::vector<int64_t>> batches;
    for (int64_t begin = 0; begin < n; begin += plan_.eval_batch_size) {
      std::vector<int64_t> indices;
      for (int64_t i = begin; i < std::min(n, begin + plan_.eval_batch_size); ++i) {
        indices.push_back(i);
      }
      batches.push_back(std::move(indices));
    }
    return batches;
  }

  // `batches` evaluated in `forwards` forwards: at shard_level 3 each forward is a collective
  // (its blocks' gathers), so a rank with fewer batches than the others runs its first again,
  // uncounted.
  StatusOr<EvalPartials> EvaluateBatches(const std::vector<std::vector<int64_t>>& batches,
                                         size_t forwards) {
    std::vector<std::vector<int64_t>> run = batches;
    while (!batches.empty() && run.size() < forwards) run.push_back(batches.front());
    module_.eval();
    at::NoGradGuard no_grad;
    EvalPartials partials;
    BatchPrefetcher prefetcher(*plan_.dataset, Split::kEval, run, stage_.data.context,
                               LoaderStepDevice());
    const Status evaluated = EvaluateFrom(prefetcher, 0, run.size(), batches.size(), partials);
    module_.train();
    if (!evaluated.ok()) return evaluated;
    return partials;
  }

  // Forwards `b` to `forwards` - 1 of the prefetcher's batches, adding those before `counted`.
  // From the first batch the model cannot evaluate block by block on some rank, every parameter
  // is whole for the rest (at shard_level 3; WholeParametersFor).
  Status EvaluateFrom(BatchPrefetcher& prefetcher, size_t b, size_t forwards, size_t counted,
                      EvalPartials& partials) {
    for (; b < forwards; ++b) {
      ENGINE_ASSIGN_OR_RETURN(Batch batch, NextBatch(prefetcher));
      ENGINE_ASSIGN_OR_RETURN(const bool whole, WholeParametersFor(batch));
      if (whole) {
        return WithWholeParameters([&]() -> Status {
          ENGINE_ASSIGN_OR_RETURN(ModelOutput output, ForwardInContext(batch));
          if (b < counted) partials.Add(output);
          return EvaluateFrom(prefetcher, b + 1, forwards, counted, partials);
        });
      }
      ENGINE_ASSIGN_OR_RETURN(ModelOutput output, ForwardInContext(batch));
      if (b < counted) partials.Add(output);
    }
    return Status::Ok();
  }

  // Whether evaluating `batch` needs every parameter whole on every rank: at shard_level 3, while
  // they are not, when the model cannot evaluate this rank's batch or another rank's block by
  // block (Model::EvaluatesBlockByBlock; the ranks agree, a collective).
  StatusOr<bool> WholeParametersFor(const Batch& batch) {
    if (parameter_shards_ == nullptr || parameter_shards_->whole()) return false;
    ENGINE_ASSIGN_OR_RETURN(const bool by_blocks,
                            GuardedCall(stage_.model.context, [&]() -> StatusOr<bool> {
                              return model_.EvaluatesBlockByBlock(batch);
                            }));
    if (data_parallel_ == nullptr) return !by_blocks;
    ENGINE_ASSIGN_OR_RETURN(std::vector<double> any,
                            data_parallel_->Max({by_blocks ? 0.0 : 1.0}).WithContext(context_));
    return any[0] > 0;
  }

  StatusOr<std::map<std::string, double>> EvaluateAndReport() {
    ENGINE_ASSIGN_OR_RETURN(auto metrics, Evaluate());
    if (!metrics.empty()) {
      Event event = MakeEvent(EventType::kEval);
      event.metrics = metrics;
      ENGINE_RETURN_IF_ERROR(Emit(event));
    }
    return metrics;
  }

  // Keeps the last keep_last periodic checkpoints this run wrote; directories from earlier runs are
  // never deleted here. At shard_level 3 each rank writes its parts of the blocks' weights, so
  // nothing is gathered (WriteOwnParts).
  Status SavePeriodicCheckpoint(bool force_optimizer_state = false) {
    CheckpointWrite write = NewCheckpointWrite(PeriodicCheckpointDir(request_.stage_dir, step_),
                                               /*final=*/false);
    write.optimizer_state |= force_optimizer_state;
    if (data_parallel_ != nullptr && plan_.world_size > 1) {
      // Every rank's random generators go into rank 0's checkpoint, so each resumes its own.
      ENGINE_ASSIGN_OR_RETURN(
          write.rank_generators,
          GatherRankGenerators(*data_parallel_, plan_.rank, plan_.world_size, device_)
              .WithContext(context_));
    }
    last_checkpoint_step_ = step_;
    ENGINE_RETURN_IF_ERROR(WriteOwnParts(write));
    ENGINE_RETURN_IF_ERROR(SaveOnRankZero(write));
    if (plan_.rank != 0) return Status::Ok();
    periodic_.erase(std::remove(periodic_.begin(), periodic_.end(), write.dir), periodic_.end());
    periodic_.push_back(write.dir);
    const uint32_t keep = config_.checkpoint().keep_last();
    while (keep > 0 && periodic_.size() > keep) {
      std::error_code ec;
      RemoveTree(periodic_.front(), ec);
      periodic_.erase(periodic_.begin());
    }
    return Status::Ok();
  }

  CheckpointWrite NewCheckpointWrite(std::filesystem::path dir, bool final) const {
    CheckpointWrite write;
    write.dir = std::move(dir);
    write.final = final;
    write.run_id = run_id_;
    write.optimizer_state = config_.checkpoint().save_optimizer_state();
    return write;
  }

  // Every rank calls this before a checkpoint: each rank of a sharded optimizer writes its own
  // parts of the state, and at shard_level 3 of the blocks' weights (a collective; the final
  // checkpoint too, so that nothing gathers the whole model), which rank 0's checkpoint then takes
  // in.
  Status WriteOwnParts(CheckpointWrite& write) {
    std::vector<RankFileParts> files;
    if (write.optimizer_state && optimizer_->sharded()) {
      files.emplace_back(RankFile::kOptimizerState, [&] { return optimizer_->StateParts(); });
    }
    if (parameter_shards_ != nullptr && !parameter_shards_->whole()) {
      const ShardLayout& layout = *parameter_shards_->layout();
      const std::vector<NamedParameter>& parameters = precision_->optimizer_parameters();
      write.weights_in_rank_files = BlockWeightTensors(layout, parameters);
      files.emplace_back(RankFile::kWeights,
                         [&layout, &parameters] { return BlockWeightParts(layout, parameters); });
    }
    if (files.empty()) return Status::Ok();
    ENGINE_ASSIGN_OR_RETURN(write.rank_files,
                            GuardedCall(context_, [&]() -> StatusOr<StagedRankFiles> {
                              return WriteRankFiles(*data_parallel_, files, write.dir);
                            }));
    return Status::Ok();
  }

  // Rank 0 writes the checkpoint (what every rank holds alike, and the ranks' files); under DDP
  // the others learn whether it did, so that none goes on after a checkpoint that was not written.
  Status SaveOnRankZero(const CheckpointWrite& write) {
    const Status saved = plan_.rank == 0 ? SaveCheckpoint(write) : Status::Ok();
    if (data_parallel_ == nullptr) return saved;
    ENGINE_ASSIGN_OR_RETURN(std::vector<double> failed,
                            data_parallel_->Max({saved.ok() ? 0.0 : 1.0}).WithContext(context_));
    if (plan_.rank == 0 || failed[0] == 0) return saved;
    return IoError(context_ + ": rank 0 could not write checkpoint " + write.dir.string() +
                   " (its log says why)");
  }

  Status SaveCheckpoint(const CheckpointWrite& write) {
    const Clock::time_point begin = Clock::now();
    ENGINE_RETURN_IF_ERROR(SaveStageCheckpoint(Parts(), Position(), write).WithContext(context_));
    LOG(INFO) << context_ << ": checkpoint " << write.dir.string() << " written in "
              << FormatNumber(std::chrono::duration<double>(Clock::now() - begin).count()) << " s";
    Event event = MakeEvent(EventType::kCheckpointSaved);
    event.path = write.dir.string();
    return Emit(event);
  }

  StageParts Parts() {
    return {&request_,
            &plan_,
            &model_,
            optimizer_.get(),
            precision_.get(),
            device_,
            frozen_base_.for_checkpoints()};
  }

  TrainingPosition Position() const { return {step_, epoch_, examples_, last_loss_, last_lr_}; }

  Event MakeEvent(EventType type) const {
    Event event;
    event.type = type;
    event.pipeline = request_.pipeline->name;
    event.stage = stage_.name;
    event.step = step_;
    event.total_steps = plan_.total_steps;
    event.epoch = epoch_;
    event.elapsed_seconds = Seconds();
    return event;
  }

  bool HasCallbacks() const {
    for (const CallbackRunner* runner : request_.callbacks) {
      if (runner->size() > 0) return true;
    }
    return false;
  }

  Status Emit(const Event& event) {
    for (CallbackRunner* runner : request_.callbacks) {
      ENGINE_RETURN_IF_ERROR(runner->Dispatch(event, *this).WithContext(context_));
    }
    return Status::Ok();
  }

  double Seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  const StageRunRequest& request_;
  StagePlan& plan_;
  const ResolvedStage& stage_;
  const proto::Stage& config_;
  Model& model_;
  torch::nn::Module& module_;
  at::Device device_;
  const std::set<std::string> host_fields_;  // the batch fields the model reads on the host
  std::string context_;
  StageFrozenBase frozen_base_;

  std::unique_ptr<PrecisionRuntime> precision_;
  std::unique_ptr<Optimizer> optimizer_;
  DataParallel* data_parallel_ = nullptr;  // process-wide; null without a process group
  // What the callbacks saved in the checkpoint this stage resumes from, until stage_begin is out.
  std::map<std::string, std::string> restored_callback_states_;
  std::unique_ptr<GradientSync> gradient_sync_;  // with data_parallel_
  // At shard_level 3, blocks of 8 MiB or more go back to the kernel when freed, and what a step
  // freed is given back after it: an MLP of 32 blocks of 2048 x 2048 peaked at 0.57x DDP's memory
  // without both and peaks at 0.38x with them, in about the same time
  // (bench/data_parallel_bench.sh).
  static constexpr int kShardLevelThreeMmapBytes = 8 << 20;
  std::optional<LargeBlocksFromMmap> large_blocks_from_mmap_;
  // At shard_level 3: the blocks' parameters in parts, installed as the block runner meanwhile.
  std::unique_ptr<ParameterShards> parameter_shards_;
  std::unique_ptr<ScopedBlockRunner> block_runner_;
  std::vector<std::filesystem::path> periodic_;
  int64_t last_checkpoint_step_ = -1;
  std::string run_id_;
  std::string stop_reason_;
  bool checkpoint_requested_ = false;
  int64_t step_ = 0;
  int64_t epoch_ = 0;
  int64_t examples_ = 0;
  double last_loss_ = 0;
  double last_lr_ = 0;
  Clock::time_point start_;
  StepPhaseSeconds phases_;
  StepPhaseSeconds phases_at_last_step_end_;
};

}  // namespace

std::string NewRunId() {
  std::random_device device;
  const uint64_t random = (static_cast<uint64_t>(device()) << 32) ^ device();
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  char text[40];
  std::snprintf(text, sizeof(text), "%012llx-%016llx",
                static_cast<unsigned long long>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(now).count()),
                static_cast<unsigned long long>(random));
  return text;
}

std::vector<int64_t> EpochOrder(uint64_t seed, int64_t epoch, int64_t n) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch) + 1);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

StatusOr<StageResult> EvaluateStage(const StageRunRequest& request,
                                    const std::filesystem::path& checkpoint) {
  StageTrainer trainer(request);
  return trainer.EvaluateOnly(checkpoint);
}

Status WithStageModel(const StageRunRequest& request, const std::filesystem::path& checkpoint,
                      const std::function<Status(Model&)>& use) {
  StageTrainer trainer(request);
  return trainer.WithPreparedModel(checkpoint, use);
}

StatusOr<StageResult> TrainStage(const StageRunRequest& request) {
  StageTrainer trainer(request);
  StatusOr<StageResult> result = trainer.Run();
  if (!result.ok()) {
    Event event;
    event.type = EventType::kError;
    event.pipeline = request.pipeline->name;
    event.stage = request.plan->stage->name;
    event.message = result.status().message();
    for (CallbackRunner* runner : request.callbacks) {
      runner->Dispatch(event, trainer).IgnoreError();
    }
  }
  return result;
}

}  // namespace engine
