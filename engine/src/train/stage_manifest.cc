#include "train/stage_manifest.h"

#include <ctime>
#include <vector>

#include "engine/dtype.h"
#include "engine/torch_compat.h"
#include "engine/version.h"

namespace engine {
namespace {

std::string UtcNow() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

}  // namespace

proto::CheckpointManifest StageManifest(const ResolvedPipeline& pipeline, const StagePlan& plan,
                                        const StageParent& parent, const std::string& optimizer,
                                        const std::string& config_json,
                                        const StageProgress& progress) {
  const ResolvedStage& stage = *plan.stage;
  proto::CheckpointManifest m;
  m.set_pipeline(pipeline.name);
  m.set_stage(stage.name);
  m.set_step(static_cast<uint64_t>(progress.step));
  m.set_total_steps(static_cast<uint64_t>(plan.total_steps));
  m.set_epoch(static_cast<uint32_t>(progress.epoch));
  m.set_final(progress.final);
  if (progress.final && !progress.stop_reason.empty()) m.set_stop_reason(progress.stop_reason);
  m.set_fingerprint(plan.fingerprint);
  if (!plan.any_world_fingerprint.empty()) {
    m.set_any_world_fingerprint(plan.any_world_fingerprint);
  }
  proto::RanksInfo* ranks = m.mutable_ranks();
  ranks->set_world_size(static_cast<uint32_t>(plan.world_size));
  ranks->set_batch_size(static_cast<uint64_t>(plan.batch_size));
  ranks->set_gradient_accumulation_steps(static_cast<uint64_t>(plan.gradient_accumulation_steps));
  ranks->set_examples_per_step(static_cast<uint64_t>(plan.global_batch));
  ranks->set_steps_per_epoch(static_cast<uint64_t>(plan.steps_per_epoch));
  ranks->set_epoch_examples(static_cast<uint64_t>(plan.epoch_examples));
  m.set_run_id(progress.run_id);
  if (!parent.checkpoint.empty()) {
    m.set_parent_checkpoint(parent.checkpoint);
    m.set_parent_run_id(parent.run_id);
  }
  m.set_created_at(UtcNow());
  m.set_engine_version(ENGINE_VERSION);
  m.set_torch_version(compat::kTorchVersion);
  m.set_data_identity(plan.data_identity);
  proto::ModelInfo* model = m.mutable_model();
  model->set_plugin(stage.model.entry->name);
  model->set_plugin_version(stage.model.entry->version);
  model->set_architecture(plan.architecture);
  model->set_config_json(config_json);
  proto::PrecisionInfo* precision = m.mutable_precision();
  precision->set_policy(plan.precision.policy);
  precision->set_plugin_version(stage.precision.entry->version);
  for (const PrecisionGroupPlan& g : plan.precision.groups) {
    proto::PrecisionGroup* group = precision->add_group();
    group->set_name(g.name);
    group->set_storage_dtype(std::string(DtypeShortName(g.storage)));
    group->set_compute_dtype(std::string(DtypeShortName(g.compute)));
    group->set_grad_dtype(std::string(DtypeShortName(g.grad)));
    group->set_master_dtype(std::string(DtypeShortName(g.master)));
    group->set_optimizer_state_dtype(std::string(DtypeShortName(g.optimizer_state)));
    group->set_num_params(g.num_elements);
    group->set_bytes(g.bytes);
  }
  m.mutable_optimizer()->set_algorithm(optimizer);
  for (const auto& [name, value] : progress.metrics) (*m.mutable_metrics())[name] = value;
  std::vector<const ResolvedPluginRef*> refs = {&stage.model, &stage.data, &stage.precision};
  if (stage.quantizer.entry != nullptr) refs.push_back(&stage.quantizer);
  for (const ResolvedPluginRef& adapter : stage.adapters) refs.push_back(&adapter);
  for (const ResolvedPluginRef* ref : refs) {
    proto::PluginVersion* v = m.add_plugin();
    v->set_name(ref->entry->name);
    v->set_kind(std::string(PluginKindName(ref->entry->kind)));
    v->set_version(ref->entry->version);
  }
  return m;
}

}  // namespace engine
