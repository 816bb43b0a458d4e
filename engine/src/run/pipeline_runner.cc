#include "run/pipeline_runner.h"

#include <glog/logging.h>

#include <cstdio>

#include "core/guarded_call.h"
#include "plan/plan_printer.h"

namespace engine {
namespace {

// Builds the stage's callbacks; a callback that cannot even be created fails the stage before step
// 0.
Status MakeCallbacks(const ResolvedStage& stage, CallbackRunner* runner) {
  for (const ResolvedCallback& c : stage.callbacks) {
    const auto* plugin = static_cast<const CallbackPlugin*>(c.ref.entry->plugin.get());
    ENGINE_ASSIGN_OR_RETURN(std::unique_ptr<Callback> callback, GuardedCall(c.ref.context, [&] {
                              return plugin->Create(*c.ref.options);
                            }));
    runner->Add(c.ref.entry->name, std::move(callback), c.on_error);
  }
  return Status::Ok();
}

}  // namespace

std::string StageSummary(const std::string& stage, const StageResult& result) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", result.seconds);
  std::string out =
      "stage '" + stage + "': " + WithThousands(result.steps) + " steps in " + seconds + " s";
  if (!result.eval_metrics.empty()) {
    out += "; eval on " + WithThousands(result.eval_examples) + " examples:";
    for (const auto& [name, value] : result.eval_metrics) {
      char text[64];
      std::snprintf(text, sizeof(text), " %s %.4f", name.substr(5).c_str(), value);
      out += text;
    }
  }
  out += "; checkpoint " + result.final_checkpoint.string();
  return out;
}

Status RunPipeline(PipelinePlan* plan, std::ostream& out, std::vector<StageOutcome>* outcomes) {
  const ResolvedPipeline& pipeline = *plan->pipeline;
  for (StagePlan& stage_plan : plan->stages) {
    const ResolvedStage& stage = *stage_plan.stage;
    CallbackRunner callbacks;
    ENGINE_RETURN_IF_ERROR(MakeCallbacks(stage, &callbacks));
    StageRunRequest request;
    request.pipeline = &pipeline;
    request.plan = &stage_plan;
    request.stage_dir = pipeline.output_dir / stage.name;
    request.callbacks = &callbacks;
    request.out = &out;
    if (stage.from_stage) {
      request.parent_checkpoint =
          pipeline.output_dir / pipeline.stages[*stage.from_stage].name / "final";
    }
    LOG(INFO) << "stage '" << stage.name << "': training " << stage_plan.total_steps << " steps on "
              << stage.device.device;
    ENGINE_ASSIGN_OR_RETURN(StageResult result, TrainStage(request));
    out << StageSummary(stage.name, result) << std::endl;
    if (outcomes != nullptr) outcomes->push_back({stage.name, result});
    // The weights live on in the checkpoint; later stages load them from there.
    stage_plan.model.reset();
  }
  return Status::Ok();
}

}  // namespace engine
