#include "plan/pipeline_plan.h"

#include <ATen/Context.h>
#include <google/protobuf/message.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include "checkpoint/checkpoint_layout.h"
#include "checkpoint/frozen_base.h"
#include "core/allocator.h"
#include "core/fingerprint.h"
#include "core/glob.h"
#include "core/guarded_call.h"
#include "core/module_tensors.h"
#include "dist/dist_env.h"
#include "engine/dtype.h"
#include "engine/format.h"
#include "engine/hash.h"
#include "engine/precision_kit.h"
#include "pipeline/pretrained_dir.h"
#include "plan/handoff.h"
#include "plan/watched_metrics.h"
#include "precision/census.h"
#include "precision/device_capability.h"

namespace engine {
namespace {

// A sharded stage's buckets hold at most this much (or bucket_mib when smaller). Gloo copies each
// all-gather piece through a buffer of its own, and buffers of DDP's 25 MiB freed and allocated
// again every step held about 100 MB more on each rank of a 50 M parameter MLP
// (bench/data_parallel_bench.sh); 4 MiB pieces cost no measurable time there.
constexpr int64_t kShardBucketBytes = int64_t{4} << 20;

std::string OptimizerSummary(const proto::Optimizer& o) {
  std::string out;
  if (o.has_sgd()) {
    const auto& s = o.sgd();
    out = "sgd lr " + FormatNumber(o.learning_rate());
    if (s.momentum() > 0) {
      out += ", momentum " + FormatNumber(s.momentum()) + (s.nesterov() ? " (nesterov)" : "");
    }
    if (s.weight_decay() > 0) out += ", weight decay " + FormatNumber(s.weight_decay());
  } else {
    const auto& a = o.adamw();
    out = "adamw lr " + FormatNumber(o.learning_rate()) + ", betas " + FormatNumber(a.beta1()) +
          "/" + FormatNumber(a.beta2()) + ", eps " + FormatNumber(a.epsilon()) + ", weight decay " +
          FormatNumber(a.weight_decay());
  }
  const auto& lr = o.lr_schedule();
  switch (lr.kind()) {
    case proto::LrSchedule::CONSTANT:
      out += "; constant learning rate";
      break;
    case proto::LrSchedule::LINEAR_WARMUP:
      out += "; linear warm-up over " + std::to_string(lr.warmup_steps()) + " steps, then constant";
      break;
    case proto::LrSchedule::COSINE:
      out += "; warm-up " + std::to_string(lr.warmup_steps()) + " steps, cosine to " +
             FormatNumber(lr.min_lr_ratio()) + "x";
      break;
  }
  out += o.max_grad_norm() > 0 ? "; clip grad norm at " + FormatNumber(o.max_grad_norm())
                               : "; no gradient clipping";
  return out;
}

class PlanBuilder {
 public:
  PlanBuilder(const ResolvedPipeline& pipeline, Diagnostics* diagnostics)
      : pipeline_(pipeline), diagnostics_(diagnostics) {}

  void Error(const std::string& path, std::string message) {
    diagnostics_->Add(pipeline_.Locate(path), std::move(message));
  }

  // The dataset's sizes and what it says of itself, each asked once (StagePlan).
  static Status DescribeDataset(const ResolvedStage& stage, StagePlan* plan) {
    return GuardedCall(stage.data.context, [&] {
      const Dataset& d = *plan->dataset;
      plan->train_examples = d.size(Split::kTrain);
      plan->eval_examples = d.size(Split::kEval);
      plan->data_spec = d.spec();
      plan->data_description = d.description();
      plan->data_identity = d.identity();
      plan->data_baselines = d.baselines();
      return Status::Ok();
    });
  }

  // Fills `plan`; returns false after reporting when the stage cannot run. `plan_only`: the model
  // is built only to be planned (ModelContext::plan_only).
  bool Build(const ResolvedStage& stage, const PipelinePlan& so_far, bool plan_only,
             StagePlan* plan) {
    plan->stage = &stage;
    if (!OpenData(stage, plan) || !CreateModel(stage, plan_only, plan)) return false;
    if (!SelectTrainable(stage, plan) || !PlanPrecision(stage, plan)) return false;
    SetQuantizedCompute(stage, plan->precision.autocast.value_or(at::kFloat), plan->model->module(),
                        &plan->layers);
    PlanCheckpoints(stage, plan);
    plan->handoff_source = HandoffSourceOf(stage, *plan);
    if (stage.from_stage && !CheckHandoff(stage, so_far, *plan)) return false;
    if (!PlanSteps(stage, plan) || !CheckCallbackMetrics(stage, *plan)) return false;
    plan->optimizer_summary = OptimizerSummary(stage.config->optimizer());
    std::tie(plan->fingerprint, plan->any_world_fingerprint) = Fingerprints(stage, so_far, *plan);
    return true;
  }

  // The model of a stage planned without it, built as Build builds it for training, into `plan`
  // with what refers to it (the layer plugins' report, the blocks); false after reporting when it
  // cannot be built or is not the model planned.
  bool BuildModel(const ResolvedStage& stage, StagePlan* plan) {
    StagePlan built;
    built.stage = &stage;
    built.data_spec = plan->data_spec;
    if (!CreateModel(stage, /*plan_only=*/false, &built) || !SelectTrainable(stage, &built)) {
      return false;
    }
    SetQuantizedCompute(stage, plan->precision.autocast.value_or(at::kFloat), built.model->module(),
                        &built.layers);
    if (plan->shard_level == 3 && !PlanBlocks(stage, &built)) return false;
    if (const std::string difference = CensusDifference(plan->census, built.census);
        !difference.empty()) {
      Error(stage.model.path, stage.subject() + ": the model built to train is not the one " +
                                  "planned: " + difference);
      return false;
    }
    plan->model = std::move(built.model);
    plan->layers = std::move(built.layers);
    plan->block_modules = std::move(built.block_modules);
    return true;
  }

  // "" when the two censuses hold the same tensors, else the first that differs.
  static std::string CensusDifference(const ParameterCensus& planned,
                                      const ParameterCensus& built) {
    const auto describe = [](const TensorCensusEntry& e) {
      return "'" + e.name + "' (" + std::string(c10::toString(e.dtype)) + ", " +
             std::to_string(e.numel) + (e.trainable ? ", trainable" : ", frozen") + ")";
    };
    for (size_t i = 0; i < std::max(planned.size(), built.size()); ++i) {
      if (i >= planned.size()) return "it has " + describe(built[i]) + ", which the plan does not";
      if (i >= built.size()) return "it lacks " + describe(planned[i]) + ", which the plan has";
      const TensorCensusEntry& p = planned[i];
      const TensorCensusEntry& b = built[i];
      if (p.name != b.name || p.dtype != b.dtype || p.numel != b.numel ||
          p.trainable != b.trainable || p.is_buffer != b.is_buffer) {
        return "tensor " + std::to_string(i) + " is " + describe(b) + ", the plan has " +
               describe(p);
      }
    }
    return "";
  }

 private:
  // The stage's dataset, opened and described; its training split must hold examples.
  bool OpenData(const ResolvedStage& stage, StagePlan* plan) {
    const auto* data_plugin = static_cast<const DataLoaderPlugin*>(stage.data.entry->plugin.get());
    DataContext data_context{pipeline_.base_dir, stage.seed};
    StatusOr<std::unique_ptr<Dataset>> dataset = GuardedCall(
        stage.data.context, [&] { return data_plugin->Open(*stage.data.options, data_context); });
    if (!dataset.ok()) {
      Error(stage.data.path + ".options", dataset.status().message());
      return false;
    }
    plan->dataset = std::move(*dataset);
    if (Status described = DescribeDataset(stage, plan); !described.ok()) {
      Error(stage.data.path, described.message());
      return false;
    }
    if (plan->train_examples <= 0) {
      Error(stage.data.path, stage.data.context + ": the training split is empty");
      return false;
    }
    return true;
  }

  // Slim or self-contained checkpoints (checkpoint/checkpoint_layout.h); a stage that trains every
  // tensor has no base to leave out.
  void PlanCheckpoints(const ResolvedStage& stage, StagePlan* plan) {
    plan->checkpoint_layout = PlanCheckpointLayout(pipeline_, stage);
    if (plan->checkpoint_layout.slim && UntrainedTensorNames(plan->model->module()).empty()) {
      plan->checkpoint_layout.slim = false;
      plan->checkpoint_layout.reason = "every tensor: it trains them all";
    }
  }

  // The model, initialised from the stage seed, with the stage's layer plugins applied.
  bool CreateModel(const ResolvedStage& stage, bool plan_only, StagePlan* plan) {
    const auto* model_plugin =
        static_cast<const ModelLoaderPlugin*>(stage.model.entry->plugin.get());
    const std::function<bool(const std::string&)> quantized = QuantizedLayers(stage);
    ModelContext model_context{&plan->data_spec, pipeline_.base_dir, stage.seed};
    model_context.linear_loaded = QuantizeOnLoad(stage, quantized);
    model_context.quantizes = quantized;
    model_context.plan_only = plan_only;
    at::manual_seed(stage.seed);
    StatusOr<std::unique_ptr<Model>> model = GuardedCall(stage.model.context, [&] {
      return model_plugin->Create(*stage.model.options, model_context);
    });
    if (!model.ok()) {
      Error(stage.model.path, model.status().message());
      return false;
    }
    plan->model = std::move(*model);
    StatusOr<std::string> architecture =
        GuardedCall(stage.model.context,
                    [&]() -> StatusOr<std::string> { return plan->model->architecture(); });
    if (!architecture.ok()) {
      Error(stage.model.path, architecture.status().message());
      return false;
    }
    plan->architecture = *architecture;
    StatusOr<ModulePrefixes> prefixes = GuardedCall(
        stage.model.context,
        [&]() -> StatusOr<ModulePrefixes> { return plan->model->transformers_module_prefixes(); });
    if (!prefixes.ok()) {
      Error(stage.model.path, prefixes.status().message());
      return false;
    }
    const std::vector<LayerPluginError> layer_errors = ApplyLayerPlugins(
        stage, plan->model->module(), *prefixes, pipeline_.base_dir, &plan->layers);
    for (const LayerPluginError& e : layer_errors) Error(e.path, e.message);
    return layer_errors.empty();
  }

  // A callback watching an evaluation metric must watch one the stage reports.
  bool CheckCallbackMetrics(const ResolvedStage& stage, const StagePlan& plan) {
    const std::vector<WatchedMetricError> errors = CheckWatchedMetrics(pipeline_, stage, plan);
    for (const WatchedMetricError& e : errors) Error(e.path, e.message);
    return errors.empty();
  }

  // Batches, ranks, steps per epoch and the stage's length in steps.
  bool PlanSteps(const ResolvedStage& stage, StagePlan* plan) {
    const proto::Schedule& s = stage.config->schedule();
    plan->batch_size = s.batch_size();
    plan->gradient_accumulation_steps = s.gradient_accumulation_steps();
    if (!PlanRanks(stage, plan)) return false;
    plan->eval_batch_size = s.eval_batch_size() > 0 ? s.eval_batch_size() : s.batch_size();
    const RankSchedule schedule =
        ScheduleAt(plan->train_examples, plan->world_size, plan->batch_size,
                   plan->gradient_accumulation_steps, s.drop_last());
    plan->micro_batches_per_epoch = schedule.micro_batches_per_epoch;
    if (plan->micro_batches_per_epoch == 0) {
      Error(stage.path() + ".schedule.batch_size",
            stage.subject() + ": schedule.batch_size " + std::to_string(plan->batch_size) +
                " is larger than the " + std::to_string(plan->train_examples) +
                " training examples and drop_last is set, so an epoch has no batch");
      return false;
    }
    plan->steps_per_epoch = schedule.steps_per_epoch;
    plan->global_batch = schedule.examples_per_step;
    plan->epoch_examples = schedule.epoch_examples;
    PlanBatchLimits(plan);
    return PlanLength(stage, plan);
  }

  // A batch or an accumulation larger than the split is accepted (one batch of all the examples,
  // one step of all the batches), with a warning, and the plan says what a step really holds.
  void PlanBatchLimits(StagePlan* plan) {
    const int64_t batch = std::min(plan->batch_size, plan->shard_examples);
    const int64_t accumulation =
        std::min(plan->gradient_accumulation_steps, plan->micro_batches_per_epoch);
    const std::string per_rank = plan->world_size > 1 ? " per rank" : "";
    if (batch < plan->batch_size) {
      plan->schedule_warnings.push_back(
          "schedule.batch_size " + std::to_string(plan->batch_size) + " is larger than the " +
          WithThousands(plan->shard_examples) + " training examples" + per_rank +
          ": a batch holds at most " + WithThousands(batch));
    }
    if (accumulation < plan->gradient_accumulation_steps) {
      plan->schedule_warnings.push_back(
          "schedule.gradient_accumulation_steps " +
          std::to_string(plan->gradient_accumulation_steps) + " is more than the " +
          WithThousands(plan->micro_batches_per_epoch) + " batches of an epoch" + per_rank +
          ": a step accumulates at most " + WithThousands(accumulation));
    }
  }

  // The stage's length in steps and epochs, and a warm-up that fits in it.
  bool PlanLength(const ResolvedStage& stage, StagePlan* plan) {
    const proto::Schedule& s = stage.config->schedule();
    if (s.length_case() == proto::Schedule::kMaxSteps) {
      plan->total_steps = static_cast<int64_t>(s.max_steps());  // bounded by the validator
      plan->epochs = static_cast<double>(plan->total_steps) / plan->steps_per_epoch;
    } else {
      const int64_t epochs = s.length_case() == proto::Schedule::kEpochs ? s.epochs() : 1;
      plan->total_steps = epochs * plan->steps_per_epoch;
      plan->epochs = static_cast<double>(epochs);
    }
    const auto& lr = stage.config->optimizer().lr_schedule();
    // Unsigned: a warm-up of 2^63 steps or more must not wrap to a negative length.
    if (lr.warmup_steps() > static_cast<uint64_t>(plan->total_steps)) {
      Error(stage.path() + ".optimizer.lr_schedule.warmup_steps",
            stage.subject() + ": optimizer.lr_schedule.warmup_steps (" +
                std::to_string(lr.warmup_steps()) + ") is longer than the stage (" +
                std::to_string(plan->total_steps) + " steps)");
      return false;
    }
    return true;
  }

  // World size and this process's rank and shard (F5: only a stage that asks for DDP or SHARDED
  // runs as several ranks, and the plan says so).
  bool PlanRanks(const ResolvedStage& stage, StagePlan* plan) {
    const proto::Parallel& parallel = stage.config->parallel();
    const std::string where = stage.subject() + ": ";
    StatusOr<DistEnv> env = ReadDistEnv();
    if (!env.ok()) {
      Error(stage.path() + ".parallel", where + env.status().message());
      return false;
    }
    const bool ddp = parallel.strategy() != proto::Parallel::NONE;
    if (!ddp && env->world_size > 1) {
      Error(stage.path() + ".parallel.strategy",
            where + "it would run as rank " + std::to_string(env->rank) +
                " of WORLD_SIZE=" + std::to_string(env->world_size) +
                ", but the stage does not ask for parallel { strategy: DDP } (or SHARDED); a "
                "stage never runs as several ranks unless it says so (run it as one process: "
                "without --nproc, torchrun or Slurm)");
      return false;
    }
    if (!PlanShardLevel(stage, plan)) return false;
    plan->bucket_bytes = static_cast<int64_t>(parallel.bucket_mib()) << 20;
    plan->world_size = ddp ? env->world_size : 1;
    plan->rank = ddp ? env->rank : 0;
    plan->dist_env = *env;
    plan->cpu_threads = ChooseCpuThreads(
        ReadCpuThreadFacts(parallel.num_threads(), ddp ? env->local_world_size : 1));
    plan->process_group = ddp && (env->world_size > 1 || env->from_environment);
    if (ddp && !PlanBackend(stage, plan)) return false;
    // Every rank takes every world_size-th example of the epoch's order, the same number each: the
    // last train_examples % world_size of the order are left out of that epoch.
    plan->shard_examples = plan->train_examples / plan->world_size;
    if (plan->shard_examples == 0) {
      Error(stage.path() + ".parallel", where + "the " + std::to_string(plan->train_examples) +
                                            " training examples cannot be shared among " +
                                            std::to_string(plan->world_size) + " ranks");
      return false;
    }
    return true;
  }

  // A SHARDED stage names what its ranks split; no other stage may.
  bool PlanShardLevel(const ResolvedStage& stage, StagePlan* plan) {
    const proto::Parallel& parallel = stage.config->parallel();
    const std::string field = stage.path() + ".parallel.shard_level";
    const std::string where = stage.subject() + ": ";
    const uint32_t level = parallel.shard_level();
    if (parallel.strategy() != proto::Parallel::SHARDED) {
      if (parallel.has_shard_level()) {
        Error(field, where +
                         "parallel.shard_level applies to strategy: SHARDED only; this stage's "
                         "strategy is " +
                         proto::Parallel::Strategy_Name(parallel.strategy()));
        return false;
      }
      return true;
    }
    if (level < 1 || level > 3) {
      Error(field,
            where +
                (level == 0 ? std::string("strategy: SHARDED needs parallel.shard_level")
                            : "parallel.shard_level " + std::to_string(level) + " does not exist") +
                "; shard_level: 1 splits the optimizer state across the ranks, 2 the "
                "gradients too, 3 the parameters too");
      return false;
    }
    plan->shard_level = static_cast<int>(level);
    if (level == 3 && !PlanBlocks(stage, plan)) return false;
    const int64_t bucket_bytes = static_cast<int64_t>(parallel.bucket_mib()) << 20;
    plan->shard_bucket_bytes =
        bucket_bytes > 0 ? std::min(bucket_bytes, kShardBucketBytes) : kShardBucketBytes;
    return true;
  }

  // shard_level 3 gathers the model's blocks one at a time: the model must name them, and they
  // must be its modules.
  bool PlanBlocks(const ResolvedStage& stage, StagePlan* plan) {
    const std::string field = stage.path() + ".parallel.shard_level";
    StatusOr<std::vector<std::string>> blocks =
        GuardedCall(stage.model.context,
                    [&]() -> StatusOr<std::vector<std::string>> { return plan->model->blocks(); });
    if (!blocks.ok()) {
      Error(stage.model.path, blocks.status().message());
      return false;
    }
    if (blocks->empty()) {
      Error(field, stage.subject() +
                       ": parallel.shard_level 3 gathers the model's parameters one block at a "
                       "time, and model '" +
                       plan->architecture +
                       "' names no blocks (Model::blocks()); shard_level: 2 splits the optimizer "
                       "state and the gradients");
      return false;
    }
    std::map<std::string, torch::nn::Module*> modules;
    for (const auto& item : plan->model->module().named_modules()) {
      modules[item.key()] = item.value().get();
    }
    for (const std::string& name : *blocks) {
      auto it = modules.find(name);
      if (it == modules.end()) {
        Error(stage.model.path, stage.model.context + ": the model names '" + name +
                                    "' among its blocks, and it has no module of that name");
        return false;
      }
      int64_t elements = 0;
      for (const at::Tensor& p : it->second->parameters()) {
        if (p.requires_grad()) elements += p.numel();
      }
      plan->block_modules.push_back(it->second);
      plan->block_trainable_elements += elements;
      plan->largest_block_trainable_elements =
          std::max(plan->largest_block_trainable_elements, elements);
    }
    plan->blocks = std::move(*blocks);
    return true;
  }

  // AUTO: NCCL for CUDA tensors where this build has it, else Gloo. NCCL on the CPU, or in a build
  // without it, is refused here rather than when the ranks meet.
  bool PlanBackend(const ResolvedStage& stage, StagePlan* plan) {
    const bool cuda = plan->device.cuda;  // probed by PlanPrecision
    const std::string where = stage.subject() + ": ";
    switch (stage.config->parallel().backend()) {
      case proto::Parallel::GLOO:
        plan->backend = DdpBackend::kGloo;
        return true;
      case proto::Parallel::NCCL:
        if (!cuda) {
          Error(stage.path() + ".parallel.backend",
                where + "backend NCCL reduces CUDA tensors, but the stage runs on " +
                    stage.device.device + " (" + stage.device.reason +
                    "); use GLOO (or AUTO, which picks Gloo there)");
          return false;
        }
        if (!NcclBuiltIn()) {
          Error(stage.path() + ".parallel.backend",
                where +
                    "backend NCCL: this engine was built without NCCL (its LibTorch has no "
                    "NCCL process group, or nccl.h was not found when it was configured); "
                    "use GLOO (or AUTO)");
          return false;
        }
        plan->backend = DdpBackend::kNccl;
        return true;
      default:
        plan->backend = cuda && NcclBuiltIn() ? DdpBackend::kNccl : DdpBackend::kGloo;
        return true;
    }
  }

  // The census, the device's capabilities and the model's declarations go to the policy; its plan
  // must then pass the invariants whoever wrote the policy.
  bool PlanPrecision(const ResolvedStage& stage, StagePlan* plan) {
    const auto* plugin =
        static_cast<const PrecisionPolicyPlugin*>(stage.precision.entry->plugin.get());
    StatusOr<std::unique_ptr<PrecisionPolicy>> policy = GuardedCall(
        stage.precision.context, [&] { return plugin->Create(*stage.precision.options); });
    if (!policy.ok()) {
      Error(stage.precision.path, policy.status().message());
      return false;
    }
    // A device that exists but cannot be used (F9: an exclusive-mode GPU another process holds)
    // fails here, named, rather than inside the first forward pass.
    if (Status usable = CheckDeviceUsable(stage.device.device); !usable.ok()) {
      Error(stage.path() + ".parallel.device", stage.subject() + ": " + usable.message());
      return false;
    }
    plan->device = ProbeDevice(stage.device.device);
    PrecisionRequest request;
    request.census = plan->census;
    request.device = plan->device;
    StatusOr<std::vector<ComputeDeclaration>> declared =
        GuardedCall(stage.model.context, [&]() -> StatusOr<std::vector<ComputeDeclaration>> {
          return plan->model->compute_declarations();
        });
    if (!declared.ok()) {
      Error(stage.model.path, declared.status().message());
      return false;
    }
    request.declared_compute = *std::move(declared);
    OptionErrors field_errors;
    StatusOr<PrecisionPlan> precision = GuardedCall(
        stage.precision.context, [&] { return (*policy)->MakePlan(request, &field_errors); });
    for (const OptionErrors::Entry& e : field_errors.entries()) {
      Error(stage.precision.path + ".options." + e.field_path,
            stage.precision.context + ": options." + e.field_path + ": " + e.message);
    }
    if (!precision.ok()) {
      Error(stage.precision.path, precision.status().message());
      return false;
    }
    if (!field_errors.empty()) return false;
    Status complete = CoversCensus(*precision, plan->census);
    if (complete.ok()) complete = CheckPlanInvariants(*precision, plan->device);
    if (!complete.ok()) {
      Error(stage.precision.path, stage.precision.context + ": " + complete.message());
      return false;
    }
    plan->precision = std::move(*precision);
    plan->precision.requested = stage.precision.entry->name;
    return true;
  }

  static Status CoversCensus(const PrecisionPlan& precision, const ParameterCensus& census) {
    std::map<std::string, const TensorPlan*> planned;
    for (const TensorPlan& t : precision.tensors) planned[t.name] = &t;
    for (const TensorCensusEntry& e : census) {
      auto it = planned.find(e.name);
      if (it == planned.end()) {
        return InternalError("the precision plan leaves tensor '" + e.name + "' out");
      }
      if (it->second->trainable != e.trainable) {
        return InternalError("the precision plan has tensor '" + e.name + "' " +
                             (e.trainable ? "frozen" : "trainable") + ", the stage has it " +
                             (e.trainable ? "trainable" : "frozen"));
      }
    }
    if (planned.size() != census.size()) {
      return InternalError("the precision plan names tensors the model does not have");
    }
    return Status::Ok();
  }

  bool SelectTrainable(const ResolvedStage& stage, StagePlan* plan) {
    const proto::Trainable& t = stage.config->trainable();
    torch::nn::Module& module = plan->model->module();
    auto parameters = module.named_parameters(/*recurse=*/true);
    std::vector<int> include_hits(t.include_size(), 0);
    std::vector<int> exclude_hits(t.exclude_size(), 0);
    for (auto& item : parameters) {
      const std::string& name = item.key();
      // With adapters and no include, the adapters alone train.
      bool included = t.include_size() == 0 && (plan->layers.adapter_parameters.empty() ||
                                                plan->layers.adapter_parameters.count(name) > 0 ||
                                                plan->layers.adapter_saved_tensors.count(name) > 0);
      for (int i = 0; i < t.include_size(); ++i) {
        if (GlobMatch(t.include(i), name)) {
          included = true;
          ++include_hits[i];
        }
      }
      bool excluded = false;
      for (int i = 0; i < t.exclude_size(); ++i) {
        if (GlobMatch(t.exclude(i), name)) {
          excluded = true;
          ++exclude_hits[i];
        }
      }
      const bool trainable = included && !excluded;
      item.value().set_requires_grad(trainable);
      plan->total_parameters += item.value().numel();
      if (trainable) {
        plan->trainable_parameters += item.value().numel();
        ++plan->trainable_tensors;
      }
    }
    plan->census = TakeCensus(module);
    bool ok = true;
    const std::string examples = ExampleNames(parameters.keys());
    for (int i = 0; i < t.include_size(); ++i) {
      if (include_hits[i] == 0) {
        Error(stage.path() + ".trainable.include[" + std::to_string(i) + "]",
              stage.subject() + ": trainable.include pattern '" + t.include(i) +
                  "' matches no parameter; parameters are named like " + examples);
        ok = false;
      }
    }
    for (int i = 0; i < t.exclude_size(); ++i) {
      if (exclude_hits[i] == 0) {
        Error(stage.path() + ".trainable.exclude[" + std::to_string(i) + "]",
              stage.subject() + ": trainable.exclude pattern '" + t.exclude(i) +
                  "' matches no parameter; parameters are named like " + examples);
        ok = false;
      }
    }
    if (ok && plan->trainable_tensors == 0) {
      Error(stage.path() + ".trainable",
            stage.subject() + ": the trainable selection leaves no parameter to train");
      ok = false;
    }
    return ok;
  }

  static std::string ExampleNames(const std::vector<std::string>& names) {
    std::string out;
    const size_t n = std::min<size_t>(names.size(), 4);
    for (size_t i = 0; i < n; ++i) out += (i ? ", '" : "'") + names[i] + "'";
    if (names.size() > n) out += ", ... (" + std::to_string(names.size()) + " in all)";
    return out;
  }

  static HandoffSource HandoffSourceOf(const ResolvedStage& stage, const StagePlan& plan) {
    HandoffSource source;
    source.stage = stage.name;
    for (const ModuleTensor& t : ModuleTensors(plan.model->module())) {
      source.tensors[t.name] = t.tensor.sizes().vec();
      if (t.buffer && !t.tensor.is_floating_point()) source.integer_tensors.insert(t.name);
    }
    source.adapter_tensors = plan.layers.adapter_parameters;
    return source;
  }

  // A stage that starts from another's weights must take every parent tensor, and have all of its
  // own from the parent except new adapters and `new_tensors`.
  bool CheckHandoff(const ResolvedStage& stage, const PipelinePlan& so_far, StagePlan& plan) {
    const StagePlan* parent = so_far.ForStage(*stage.from_stage);
    if (parent == nullptr) return true;  // the parent failed and was reported already
    const Handoff handoff =
        PlanHandoff(parent->handoff_source, plan.model->module(), plan.layers.adapter_parameters,
                    stage.config->parent_adapters() == proto::Stage::MERGE,
                    {stage.config->new_tensors().begin(), stage.config->new_tensors().end()});
    if (handoff.problems.empty()) {
      plan.handoff_summary = HandoffSummary(handoff);
      plan.parent_architecture = parent->architecture;
      return true;
    }
    Error(stage.path() + ".from_stage",
          stage.subject() + " starts from stage '" + parent->stage->name +
              "', but their models do not fit: " + HandoffProblems(handoff));
    return false;
  }

  // The stage's fingerprint and its any_world_fingerprint (StagePlan).
  std::pair<std::string, std::string> Fingerprints(const ResolvedStage& stage,
                                                   const PipelinePlan& so_far,
                                                   const StagePlan& plan) {
    // Where and how often checkpoints are kept changes no weight: a stage whose checkpointing
    // changed is still up to date, and still resumes.
    proto::Stage config = *stage.config;
    config.clear_checkpoint();
    config.mutable_schedule()->clear_checkpoint_every_steps();
    // Ranks (DDP or SHARDED, at any level) compute what one rank with all of a step's examples
    // computes: what counts is the schedule the batches make, not how the ranks split them.
    const bool ranked = config.parallel().strategy() != proto::Parallel::NONE;
    if (ranked) {
      proto::Parallel* parallel = config.mutable_parallel();
      parallel->clear_strategy();
      parallel->clear_shard_level();
      parallel->clear_bucket_mib();
      parallel->clear_backend();
      config.mutable_schedule()->clear_batch_size();
      config.mutable_schedule()->clear_gradient_accumulation_steps();
    }
    std::string text = CanonicalText(config);
    auto add_plugin = [&text](const ResolvedPluginRef& ref,
                              const google::protobuf::Message* options = nullptr) {
      text += "|" + std::string(PluginKindName(ref.entry->kind)) + ":" + ref.entry->name + "@" +
              ref.entry->version + ":" + CanonicalText(options ? *options : *ref.options);
    };
    // A base moved elsewhere (found by content) is the same base: the stage's paths as written.
    std::unique_ptr<google::protobuf::Message> model_options(stage.model.options->New());
    model_options->CopyFrom(*stage.model.options);
    std::unique_ptr<google::protobuf::Message> data_options(stage.data.options->New());
    data_options->CopyFrom(*stage.data.options);
    UndoPretrainedMove(stage, *model_options, *data_options);
    add_plugin(stage.model, model_options.get());
    add_plugin(stage.data, data_options.get());
    add_plugin(stage.precision);
    if (stage.quantizer.entry != nullptr) add_plugin(stage.quantizer);
    for (const ResolvedPluginRef& adapter : stage.adapters) add_plugin(adapter);
    // A stage's callbacks can end it early (early stopping), so their options count.
    for (const ResolvedCallback& callback : stage.callbacks) add_plugin(callback.ref);
    text += "|precision:" + plan.precision.policy;
    // The dtype quantized layers multiply in follows the stage's precision unless pinned.
    if (!plan.layers.quantized_compute.empty()) {
      text += "|quantized_compute:" + plan.layers.quantized_compute;
    }
    text += "|seed:" + std::to_string(stage.seed);
    const std::string schedule = ranked ? "|schedule:" + std::to_string(plan.global_batch) + "/" +
                                              std::to_string(plan.steps_per_epoch) + "/" +
                                              std::to_string(plan.epoch_examples)
                                        : "|world:" + std::to_string(plan.world_size);
    std::string rest = "|data:" + plan.data_identity;
    // A slim checkpoint is of no use to a reader that builds another base.
    if (plan.checkpoint_layout.slim) rest += "|checkpoints:slim";
    for (int dep : stage.dependencies) {
      if (const StagePlan* parent = so_far.ForStage(dep)) rest += "|after:" + parent->fingerprint;
    }
    // Only a ranked stage has one: a plain stage's checkpoints are another configuration's.
    return {Fnv1a64Hex(text + schedule + rest),
            ranked ? Fnv1a64Hex("ranked|" + text + rest) : std::string()};
  }

  const ResolvedPipeline& pipeline_;
  Diagnostics* diagnostics_;
};

}  // namespace

RankSchedule ScheduleAt(int64_t train_examples, int64_t world_size, int64_t batch_size,
                        int64_t accumulation, bool drop_last) {
  RankSchedule s;
  s.shard_examples = world_size > 0 ? train_examples / world_size : 0;
  if (batch_size <= 0 || accumulation <= 0) return s;
  s.micro_batches_per_epoch =
      drop_last ? s.shard_examples / batch_size : (s.shard_examples + batch_size - 1) / batch_size;
  s.steps_per_epoch = (s.micro_batches_per_epoch + accumulation - 1) / accumulation;
  s.examples_per_step = std::min(batch_size, s.shard_examples) *
                        std::min(accumulation, s.micro_batches_per_epoch) * world_size;
  s.epoch_examples =
      (drop_last ? s.micro_batches_per_epoch * batch_size : s.shard_examples) * world_size;
  return s;
}

const StagePlan* PipelinePlan::ForStage(int stage_index) const {
  for (const StagePlan& s : stages) {
    if (s.stage != nullptr && s.stage->index == stage_index) return &s;
  }
  return nullptr;
}

std::unique_ptr<PipelinePlan> BuildPlan(const ResolvedPipeline& pipeline, Diagnostics* diagnostics,
                                        PlanModels models) {
  auto plan = std::make_unique<PipelinePlan>();
  plan->pipeline = &pipeline;
  PlanBuilder builder(pipeline, diagnostics);
  plan->stages.reserve(pipeline.run_order.size());
  for (int index : pipeline.run_order) {
    const bool keep = models == PlanModels::kKeep;
    StagePlan stage_plan;
    if (builder.Build(pipeline.stages[index], *plan, /*plan_only=*/!keep, &stage_plan)) {
      if (!keep) {
        stage_plan.model.reset();
        ReturnFreedMemory();
      }
      plan->stages.push_back(std::move(stage_plan));
    }
  }
  if (!diagnostics->empty()) return nullptr;
  return plan;
}

Status BuildStageModel(const ResolvedPipeline& pipeline, StagePlan* plan) {
  Diagnostics diagnostics;
  PlanBuilder builder(pipeline, &diagnostics);
  if (!builder.BuildModel(*plan->stage, plan)) {
    return FailedPreconditionError(diagnostics.ToString());
  }
  return Status::Ok();
}

}  // namespace engine
