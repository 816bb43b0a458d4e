#include "run/pipeline_runner.h"

#include <glog/logging.h>

#include <chrono>
#include <cstdio>

#include "core/guarded_call.h"
#include "plan/plan_printer.h"

namespace engine {
namespace {

// Builds callbacks; one that cannot even be created fails the run before step 0.
Status MakeCallbacks(const std::vector<ResolvedCallback>& refs, const CallbackContext& context,
                     CallbackRunner* runner) {
  for (const ResolvedCallback& c : refs) {
    const auto* plugin = static_cast<const CallbackPlugin*>(c.ref.entry->plugin.get());
    ENGINE_ASSIGN_OR_RETURN(std::unique_ptr<Callback> callback, GuardedCall(c.ref.context, [&] {
                              return plugin->Create(*c.ref.options, context);
                            }));
    runner->Add(c.ref.entry->name, std::move(callback), c.on_error);
  }
  return Status::Ok();
}

// Pipeline events happen between stages, where stopping or checkpointing means nothing.
class PipelineActions : public CallbackActions {
 public:
  void RequestStop(const std::string& reason) override {
    LOG(WARNING) << "a pipeline callback asked to stop (" << reason
                 << ") outside a stage; nothing to stop";
  }
  void RequestCheckpoint() override {}
};

}  // namespace

std::string StageSummary(const std::string& stage, const StageResult& result) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", result.seconds);
  std::string out =
      "stage '" + stage + "': " + WithThousands(result.steps) + " steps in " + seconds + " s";
  if (!result.stop_reason.empty()) out += " (stopped early: " + result.stop_reason + ")";
  if (!result.eval_metrics.empty()) {
    out += "; eval on " + WithThousands(result.eval_examples) + " examples:";
    for (const auto& [name, value] : result.eval_metrics) {
      char text[64];
      std::snprintf(text, sizeof(text), " %s %.4f", name.substr(5).c_str(), value);
      out += text;
      auto baseline = result.eval_baselines.find(name);
      if (baseline != result.eval_baselines.end()) {
        std::snprintf(text, sizeof(text), " (baseline %.4f)", baseline->second);
        out += text;
      }
    }
  }
  out += "; checkpoint " + result.final_checkpoint.string();
  return out;
}

Status RunPipeline(PipelinePlan* plan, std::ostream& out, std::vector<StageOutcome>* outcomes) {
  const ResolvedPipeline& pipeline = *plan->pipeline;
  const auto start = std::chrono::steady_clock::now();
  CallbackRunner pipeline_callbacks;
  ENGINE_RETURN_IF_ERROR(MakeCallbacks(pipeline.callbacks,
                                       {pipeline.name, pipeline.base_dir, pipeline.output_dir, ""},
                                       &pipeline_callbacks));
  PipelineActions pipeline_actions;
  auto pipeline_event = [&](EventType type, std::string message) {
    Event event;
    event.type = type;
    event.pipeline = pipeline.name;
    event.message = std::move(message);
    event.elapsed_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return pipeline_callbacks.Dispatch(event, pipeline_actions);
  };
  ENGINE_RETURN_IF_ERROR(pipeline_event(EventType::kPipelineBegin, ""));

  for (StagePlan& stage_plan : plan->stages) {
    const ResolvedStage& stage = *stage_plan.stage;
    const std::filesystem::path stage_dir = pipeline.output_dir / stage.name;
    CallbackRunner stage_callbacks;
    ENGINE_RETURN_IF_ERROR(MakeCallbacks(stage.callbacks,
                                         {pipeline.name, pipeline.base_dir, stage_dir, stage.name},
                                         &stage_callbacks));
    StageRunRequest request;
    request.pipeline = &pipeline;
    request.plan = &stage_plan;
    request.stage_dir = stage_dir;
    request.callbacks = {&stage_callbacks, &pipeline_callbacks};
    request.out = &out;
    if (stage.from_stage) {
      request.parent_checkpoint =
          pipeline.output_dir / pipeline.stages[*stage.from_stage].name / "final";
    }
    LOG(INFO) << "stage '" << stage.name << "': training " << stage_plan.total_steps << " steps on "
              << stage.device.device;
    StatusOr<StageResult> result = TrainStage(request);
    if (!result.ok()) {
      pipeline_event(EventType::kPipelineEnd, "failed: " + result.status().message()).IgnoreError();
      return result.status();
    }
    out << StageSummary(stage.name, *result) << std::endl;
    if (outcomes != nullptr) outcomes->push_back({stage.name, *result});
    // The weights live on in the checkpoint; later stages load them from there.
    stage_plan.model.reset();
  }
  return pipeline_event(EventType::kPipelineEnd, "finished");
}

}  // namespace engine
