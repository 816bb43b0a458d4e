#include "train/stage_checkpoint.h"

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_tensors.h"
#include "checkpoint/frozen_base.h"
#include "checkpoint/peft_adapters.h"
#include "checkpoint/tensor_pieces.h"
#include "core/guarded_call.h"
#include "core/logging.h"
#include "core/module_tensors.h"
#include "core/remove_tree.h"
#include "engine/safetensors.h"
#include "text/stage_tokenizer.h"
#include "train/callback_runner.h"
#include "train/stage_manifest.h"
#include "train/training_state.h"

namespace engine {
namespace {

// optimizer.safetensors: the optimizer's slots, the f32 masters and the training state.
void AddOptimizerState(const StageParts& parts, const TrainingPosition& position,
                       const CheckpointWrite& write, CheckpointContents* contents) {
  contents->optimizer = parts.optimizer->State();
  for (auto& master : parts.precision->MasterTensors()) contents->optimizer.push_back(master);
  TrainingState training;
  training.algorithm = parts.optimizer->algorithm();
  training.optimizer_steps = parts.optimizer->steps();
  training.scaler = parts.precision->scaler_state();
  training.examples = position.examples;
  training.last_loss = position.last_loss;
  training.last_lr = position.last_lr;
  training.generators["cpu"] = GeneratorState(at::Device(at::kCPU));
  if (!parts.device.is_cpu())
    training.generators[parts.device.str()] = GeneratorState(parts.device);
  training.generators.insert(write.rank_generators.begin(), write.rank_generators.end());
  training.callback_states = SaveCallbackStates(parts.request->callbacks);
  contents->optimizer_metadata = AppendTrainingState(training, contents->optimizer);
}

// adapter_model.safetensors and adapter_config.json, as PEFT reads them
// (checkpoint/peft_adapters.h).
Status AddAdapters(const StageParts& parts, const CheckpointWrite& write,
                   CheckpointContents* contents) {
  const ResolvedStage& stage = *parts.plan->stage;
  // The ranks' files hold the blocks' adapters, which this rank holds only parts of.
  if (stage.adapters.empty() || !write.weights_in_rank_files.empty()) return Status::Ok();
  const std::filesystem::path base = PeftBaseModel(stage, *parts.request->pipeline);
  ENGINE_ASSIGN_OR_RETURN(
      PeftAdapterFiles files,
      MakePeftAdapterFiles(stage, parts.model->module(), base.string(),
                           /*module_prefixes=*/{}, parts.request->pipeline->base_dir));
  contents->adapters = std::move(files.tensors);
  contents->adapter_config_json = std::move(files.config_json);
  return Status::Ok();
}

// model.safetensors: every tensor of the model; a slim checkpoint's leaves out its frozen base and
// the tensors adapter_model.safetensors already holds (the manifest lists both), and a shard_level
// 3 stage's the blocks' weights the ranks' files hold.
void AddModelTensors(const StageParts& parts, const CheckpointWrite& write,
                     CheckpointContents* contents) {
  const std::vector<ModuleTensor> tensors = ModuleTensors(parts.model->module());
  std::set<std::string> left_out;
  for (const proto::TensorInfo& info : write.weights_in_rank_files) left_out.insert(info.name());
  contents->rank_file_tensors = write.weights_in_rank_files;
  if (parts.frozen_base != nullptr) {
    left_out.merge(BaseTensorNames(*parts.frozen_base));
    *contents->manifest.mutable_frozen_base() = *parts.frozen_base;
    std::set<std::string> names;
    for (const ModuleTensor& t : tensors) names.insert(t.name);
    const size_t prefix = std::strlen(kPeftPrefix);
    for (const auto& [peft_name, tensor] : contents->adapters) {
      // PEFT names some tensors otherwise than the model ("<layer>.base_layer.bias"): those stay in
      // model.safetensors too.
      const std::string name = peft_name.substr(prefix);
      if (names.count(name) == 0) continue;
      contents->manifest.add_adapter_file_tensor(name);
      left_out.insert(name);
    }
  }
  for (const ModuleTensor& t : tensors) {
    if (left_out.count(t.name) == 0) contents->model.emplace_back(t.name, t.tensor);
  }
}

// The checkpoint's tensors in `dir` matched to the stage's by name, before anything is changed:
// the same names, dtypes and shapes, in the module's order. The tensors of a slim checkpoint's
// base must be the stage's too, as the manifest describes them; they stay as the stage built them.
// Each is read only when it is copied in: the ranks' pieces of a shard_level 3
// checkpoint are put together one tensor at a time.
StatusOr<std::vector<std::pair<at::Tensor, std::string>>> MatchWeights(
    const CheckpointTensors& weights, const proto::CheckpointManifest& manifest,
    torch::nn::Module& module, const std::string& where) {
  std::map<std::string, const proto::TensorInfo*> base;
  for (const proto::TensorInfo& info : manifest.frozen_base().tensor()) base[info.name()] = &info;
  std::vector<ModuleTensor> targets;
  for (ModuleTensor& target : ModuleTensors(module)) {
    auto it = base.find(target.name);
    if (it == base.end()) {
      targets.push_back(std::move(target));
      continue;
    }
    const proto::TensorInfo built = DescribeTensor(target.name, target.tensor);
    if (built.dtype() != it->second->dtype() ||
        !std::equal(built.shape().begin(), built.shape().end(), it->second->shape().begin(),
                    it->second->shape().end())) {
      return DataLossError(where + ": base tensor '" + target.name +
                           "' was built with another dtype or shape than its manifest records");
    }
    base.erase(it);
  }
  if (!base.empty()) {
    return DataLossError(where + ": base tensor '" + base.begin()->first +
                         "' is not in this stage's model");
  }
  if (targets.size() != weights.tensors().size()) {
    return DataLossError(where + ": it holds " + std::to_string(weights.tensors().size()) +
                         " tensors, this stage's model " + std::to_string(targets.size()) +
                         (manifest.has_frozen_base() ? " outside its frozen base" : ""));
  }
  std::vector<std::pair<at::Tensor, std::string>> pairs;
  for (const ModuleTensor& target : targets) {
    const safetensors::TensorInfo* info = weights.Find(target.name);
    if (info == nullptr || info->dtype != target.tensor.scalar_type() ||
        !target.tensor.sizes().equals(info->shape)) {
      return DataLossError(where + ": tensor '" + target.name +
                           "' is missing there or has another dtype or shape");
    }
    pairs.emplace_back(target.tensor, target.name);
  }
  return pairs;
}

// The manifest of a periodic checkpoint this stage can go on from: its configuration, and a step
// and epoch inside this stage's schedule.
StatusOr<proto::CheckpointManifest> ReadResumableManifest(const StagePlan& plan,
                                                          const std::filesystem::path& dir,
                                                          const std::string& where) {
  ENGINE_ASSIGN_OR_RETURN(proto::CheckpointManifest manifest, ReadManifest(dir).WithContext(where));
  if (manifest.fingerprint() != plan.fingerprint) {
    return FailedPreconditionError(where + ": it was written by another configuration (" +
                                   manifest.fingerprint() + ", this stage is " + plan.fingerprint +
                                   ")");
  }
  const int64_t step = static_cast<int64_t>(manifest.step());
  const int64_t epoch = static_cast<int64_t>(manifest.epoch());
  if (manifest.final() || step <= 0 || step >= plan.total_steps ||
      step < epoch * plan.steps_per_epoch || step > (epoch + 1) * plan.steps_per_epoch) {
    return DataLossError(where + ": its step " + std::to_string(step) + " and epoch " +
                         std::to_string(epoch) + " do not fit this stage's " +
                         std::to_string(plan.total_steps) + " steps of " +
                         std::to_string(plan.steps_per_epoch) + " per epoch");
  }
  return manifest;
}

// The optimizer's slots and the masters, whole in optimizer.safetensors or in the ranks' files of
// a sharded stage (train/rank_files.h).
StatusOr<TensorPieces> ReadOptimizerState(const std::filesystem::path& dir,
                                          const proto::CheckpointManifest& manifest,
                                          const SavedTrainingState& saved,
                                          const std::string& where) {
  safetensors::NamedTensors whole = saved.optimizer_slots;
  whole.insert(whole.end(), saved.masters.begin(), saved.masters.end());
  TensorPieces state = TensorPieces::FromWhole(whole);
  ENGINE_ASSIGN_OR_RETURN(std::vector<std::string> names,
                          RankFiles(manifest, RankFile::kOptimizerState).WithContext(where));
  if (names.empty()) return state;
  std::vector<std::filesystem::path> files;
  for (const std::string& name : names) files.push_back(dir / name);
  ENGINE_ASSIGN_OR_RETURN(TensorPieces ranks, TensorPieces::Open(files).WithContext(where));
  ENGINE_RETURN_IF_ERROR(state.Merge(std::move(ranks)).WithContext(where));
  return state;
}

// This rank's generators as the checkpoint saved them (rank 0's under their device names, the
// others' under RankGeneratorKey).
void RestoreGenerators(const StageParts& parts, const TrainingState& training,
                       const std::string& where) {
  const int rank = parts.plan->rank;
  const bool first = rank == 0;
  auto cpu = training.generators.find(first ? "cpu" : RankGeneratorKey(rank, false));
  if (cpu != training.generators.end()) {
    SetGeneratorState(at::Device(at::kCPU), cpu->second);
  } else {
    LOG(WARNING) << where << ": it holds no random generator state for rank " << rank
                 << "; that rank's dropout draws start afresh from the stage seed";
  }
  if (!parts.device.is_cpu()) {
    auto it = training.generators.find(first ? parts.device.str() : RankGeneratorKey(rank, true));
    if (it != training.generators.end()) SetGeneratorState(parts.device, it->second);
  }
}

}  // namespace

Status SaveStageCheckpoint(const StageParts& parts, const TrainingPosition& position,
                           const CheckpointWrite& write) {
  RemoveStaleTemporaries(write.dir.parent_path(), /*keep=*/write.rank_files.dir);
  // The ranks' staged files go with the checkpoint (WriteCheckpoint then owns them), or, on an
  // error before it is written, away.
  ScopedRemoveTree staged(write.rank_files.dir);
  CheckpointContents contents;
  StageProgress progress;
  progress.step = position.step;
  progress.epoch = position.epoch;
  progress.final = write.final;
  progress.stop_reason = write.stop_reason;
  progress.run_id = write.run_id;
  progress.metrics = write.metrics;
  const StageRunRequest& request = *parts.request;
  const ResolvedPluginRef& model_ref = parts.plan->stage->model;
  ENGINE_ASSIGN_OR_RETURN(contents.config_json,
                          GuardedCall(model_ref.context, [&]() -> StatusOr<std::string> {
                            return parts.model->config_json();
                          }));
  ENGINE_RETURN_IF_ERROR(
      SetTokenIds(*parts.plan->stage, request.pipeline->base_dir, &contents.config_json));
  contents.manifest = StageManifest(*request.pipeline, *parts.plan,
                                    {request.parent_checkpoint.string(), request.parent_run_id},
                                    parts.optimizer->algorithm(), contents.config_json, progress);
  ENGINE_RETURN_IF_ERROR(AddAdapters(parts, write, &contents));
  AddModelTensors(parts, write, &contents);
  if (write.optimizer_state) AddOptimizerState(parts, position, write, &contents);
  ENGINE_ASSIGN_OR_RETURN(contents.extra_files,
                          StageTokenizerFiles(*parts.plan->stage, request.pipeline->base_dir));
  contents.staged_dir = write.rank_files.dir;
  contents.staged_files = write.rank_files.files;
  staged.Release();
  return WriteCheckpoint(write.dir, std::move(contents));
}

StatusOr<RestoredStage> RestoreStageCheckpoint(const StageParts& parts, const std::string& context,
                                               const std::filesystem::path& dir) {
  const std::string where = context + ": resuming from '" + dir.string() + "'";
  ENGINE_ASSIGN_OR_RETURN(proto::CheckpointManifest manifest,
                          ReadResumableManifest(*parts.plan, dir, where));
  ENGINE_ASSIGN_OR_RETURN(CheckpointTensors weights,
                          CheckpointTensors::Open(dir, manifest).WithContext(where));
  ENGINE_ASSIGN_OR_RETURN(auto state,
                          safetensors::File::Open(dir / kOptimizerFile).WithContext(where));
  if (manifest.has_frozen_base()) {
    if (parts.frozen_base == nullptr) {
      return FailedPreconditionError(where +
                                     ": it holds only what the stage changed over a frozen "
                                     "base, and this stage writes every tensor");
    }
    ENGINE_RETURN_IF_ERROR(CheckSameBase(manifest.frozen_base(), *parts.frozen_base, where));
  }
  ENGINE_ASSIGN_OR_RETURN(auto pairs,
                          MatchWeights(weights, manifest, parts.model->module(), where));
  ENGINE_ASSIGN_OR_RETURN(SavedTrainingState saved, ReadTrainingState(*state).WithContext(where));
  const TrainingState& training = saved.state;
  ENGINE_ASSIGN_OR_RETURN(TensorPieces slots, ReadOptimizerState(dir, manifest, saved, where));

  // The masters go where the stage keeps them: the precision runtime (whole), or its optimizer.
  safetensors::NamedTensors masters;
  if (parts.precision->master_holder() != MasterHolder::kOptimizer) {
    ENGINE_ASSIGN_OR_RETURN(masters, slots.TakeWhole(IsMasterStateName));
  }
  ENGINE_RETURN_IF_ERROR(
      parts.optimizer->LoadStatePieces(slots, training.optimizer_steps).WithContext(where));
  ENGINE_RETURN_IF_ERROR(parts.precision->Restore(masters, training.scaler).WithContext(where));
  ENGINE_RETURN_IF_ERROR(
      parts.precision->VerifyOptimizerState(*parts.optimizer).WithContext(where));
  ENGINE_RETURN_IF_ERROR(GuardedCall(where, [&] {
    at::NoGradGuard no_grad;
    for (auto& [target, name] : pairs) {
      ENGINE_ASSIGN_OR_RETURN(at::Tensor source, weights.Get(name).WithContext(where));
      target.copy_(source);
    }
    RestoreGenerators(parts, training, where);
    return Status::Ok();
  }));

  RestoredStage restored;
  restored.position.step = static_cast<int64_t>(manifest.step());
  restored.position.epoch = static_cast<int64_t>(manifest.epoch());
  restored.position.examples = training.examples;
  restored.position.last_loss = training.last_loss;
  restored.position.last_lr = training.last_lr;
  restored.callback_states = training.callback_states;
  return restored;
}

}  // namespace engine
