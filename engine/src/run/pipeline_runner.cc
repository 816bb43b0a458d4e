#include "run/pipeline_runner.h"

#include <chrono>
#include <cstdio>

#include "core/guarded_call.h"
#include "core/interrupt.h"
#include "core/logging.h"
#include "plan/plan_printer.h"
#include "run/stage_state.h"

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

namespace {

std::string MetricsText(const std::map<std::string, double>& metrics,
                        const std::map<std::string, double>& baselines) {
  std::string out;
  for (const auto& [name, value] : metrics) {
    char text[64];
    const std::string shown = name.rfind("eval/", 0) == 0 ? name.substr(5) : name;
    std::snprintf(text, sizeof(text), " %s %.4f", shown.c_str(), value);
    out += text;
    auto baseline = baselines.find(name);
    if (baseline != baselines.end()) {
      std::snprintf(text, sizeof(text), " (baseline %.4f)", baseline->second);
      out += text;
    }
  }
  return out;
}

std::string StageNames(const ResolvedPipeline& pipeline) {
  std::string names;
  for (const ResolvedStage& s : pipeline.stages) {
    names += (names.empty() ? "'" : ", '") + s.name + "'";
  }
  return names;
}

}  // namespace

std::string StageSummary(const std::string& stage, const StageResult& result) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", result.seconds);
  std::string out =
      "stage '" + stage + "': " + WithThousands(result.steps) + " steps in " + seconds + " s";
  if (result.resumed_from_step > 0) {
    out += " (resumed after step " + WithThousands(result.resumed_from_step) + ")";
  }
  if (!result.stop_reason.empty()) out += " (stopped early: " + result.stop_reason + ")";
  if (!result.eval_metrics.empty()) {
    out += "; eval on " + WithThousands(result.eval_examples) +
           " examples:" + MetricsText(result.eval_metrics, result.eval_baselines);
  }
  out += "; checkpoint " + result.final_checkpoint.string();
  return out;
}

std::string ReusedStageSummary(const std::string& stage, const std::string& why,
                               const proto::CheckpointManifest& manifest,
                               const std::filesystem::path& dir) {
  std::string out = "stage '" + stage + "': " + why + "; " +
                    WithThousands(static_cast<int64_t>(manifest.step())) + " steps, finished " +
                    manifest.created_at();
  const std::map<std::string, double> metrics(manifest.metrics().begin(), manifest.metrics().end());
  if (!metrics.empty()) out += "; eval:" + MetricsText(metrics, {});
  out += "; checkpoint " + dir.string();
  return out;
}

Status CheckRunOptions(const ResolvedPipeline& pipeline, const RunOptions& options) {
  auto known = [&pipeline](const std::string& name) {
    for (const ResolvedStage& s : pipeline.stages) {
      if (s.name == name) return true;
    }
    return false;
  };
  for (const std::string& name : options.force) {
    if (!known(name)) {
      return InvalidArgumentError("--force names stage '" + name +
                                  "', which the pipeline does not have; its stages are " +
                                  StageNames(pipeline));
    }
  }
  if (!options.from.empty() && !known(options.from)) {
    return InvalidArgumentError("--from names stage '" + options.from +
                                "', which the pipeline does not have; its stages are " +
                                StageNames(pipeline));
  }
  return Status::Ok();
}

Status RunPipeline(PipelinePlan* plan, const RunOptions& options, std::ostream& out,
                   std::vector<StageOutcome>* outcomes) {
  ENGINE_RETURN_IF_ERROR(CheckRunOptions(*plan->pipeline, options));
  const ResolvedPipeline& pipeline = *plan->pipeline;
  const auto start = std::chrono::steady_clock::now();
  // Under DDP, callbacks (progress, logs, early stopping) run once, on rank 0; the trainer spreads
  // their stop requests to the other ranks.
  const bool leader = plan->stages.empty() || plan->stages.front().rank == 0;
  CallbackRunner pipeline_callbacks;
  if (leader) {
    ENGINE_RETURN_IF_ERROR(MakeCallbacks(
        pipeline.callbacks, {pipeline.name, pipeline.base_dir, pipeline.output_dir, ""},
        &pipeline_callbacks));
  }
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
  auto fail = [&](Status status) {
    pipeline_event(EventType::kPipelineEnd, "failed: " + status.message()).IgnoreError();
    return status;
  };

  // The run_id of each stage's final checkpoint once it is known (reused or trained now).
  std::map<int, std::string> final_run_ids;
  bool from_reached = options.from.empty();
  for (StagePlan& stage_plan : plan->stages) {
    const ResolvedStage& stage = *stage_plan.stage;
    if (InterruptRequested()) {
      return fail(AbortedError("interrupted by " + InterruptSignalName() + " before stage '" +
                               stage.name + "'. Run the same command again to go on"));
    }
    if (stage.name == options.from) from_reached = true;
    const std::filesystem::path stage_dir = pipeline.output_dir / stage.name;
    const std::filesystem::path final_dir = stage_dir / "final";
    std::string parent_run_id;
    std::filesystem::path parent_checkpoint;
    if (stage.from_stage) {
      parent_run_id = final_run_ids[*stage.from_stage];
      parent_checkpoint = pipeline.output_dir / pipeline.stages[*stage.from_stage].name / "final";
    }

    const bool forced =
        options.force.count(stage.name) > 0 || (!options.from.empty() && from_reached);
    std::optional<ResumePoint> resume;
    if (!forced) {
      const FinalCheckpointState final_state =
          InspectFinalCheckpoint(final_dir, stage_plan.fingerprint, parent_run_id);
      const bool reuse_as_is =
          !from_reached && final_state.manifest && final_state.manifest->final();
      if (final_state.up_to_date || reuse_as_is) {
        const std::string why =
            final_state.up_to_date
                ? "up to date (--force=" + stage.name + " trains it again)"
                : "used as it is (--from=" + options.from + "), although " + final_state.reason;
        out << ReusedStageSummary(stage.name, why, *final_state.manifest, final_dir) << std::endl;
        final_run_ids[stage.index] = final_state.manifest->run_id();
        if (outcomes != nullptr) {
          StageOutcome outcome{stage.name, {}, true};
          outcome.result.steps = static_cast<int64_t>(final_state.manifest->step());
          outcome.result.final_checkpoint = final_dir;
          outcome.result.eval_metrics.insert(final_state.manifest->metrics().begin(),
                                             final_state.manifest->metrics().end());
          outcomes->push_back(std::move(outcome));
        }
        stage_plan.model.reset();
        continue;
      }
      if (!from_reached) {
        return fail(FailedPreconditionError(
            "stage '" + stage.name + "' comes before --from=" + options.from +
            " but cannot be used as it is: " + final_state.reason + " in " + final_dir.string() +
            ". Run without --from to train it"));
      }
      if (final_state.found) {
        out << "stage '" << stage.name << "': training again: " << final_state.reason << std::endl;
      }
      std::vector<std::string> notes;
      resume = FindResumePoint(stage_dir, stage_plan.fingerprint, parent_run_id, &notes);
      for (const std::string& note : notes) {
        LOG(WARNING) << "stage '" << stage.name << "': not resuming from " << note;
        out << "stage '" << stage.name << "': not resuming from " << note << std::endl;
      }
    }

    CallbackRunner stage_callbacks;
    if (Status made = leader
                          ? MakeCallbacks(stage.callbacks,
                                          {pipeline.name, pipeline.base_dir, stage_dir, stage.name},
                                          &stage_callbacks)
                          : Status::Ok();
        !made.ok()) {
      return fail(made);
    }
    StageRunRequest request;
    request.pipeline = &pipeline;
    request.plan = &stage_plan;
    request.stage_dir = stage_dir;
    request.callbacks = {&stage_callbacks, &pipeline_callbacks};
    request.out = &out;
    request.parent_checkpoint = parent_checkpoint;
    request.parent_run_id = parent_run_id;
    request.run_id = resume ? resume->manifest.run_id() : NewRunId();
    if (resume) {
      request.resume_from = resume->dir;
      out << "stage '" << stage.name << "': resuming after step "
          << WithThousands(static_cast<int64_t>(resume->manifest.step())) << " of "
          << WithThousands(stage_plan.total_steps) << " from " << resume->dir.string() << std::endl;
    }
    LOG(INFO) << "stage '" << stage.name << "': training " << stage_plan.total_steps << " steps on "
              << stage.device.device;
    StatusOr<StageResult> result = TrainStage(request);
    if (!result.ok()) return fail(result.status());
    final_run_ids[stage.index] = request.run_id;
    out << StageSummary(stage.name, *result) << std::endl;
    if (outcomes != nullptr) outcomes->push_back({stage.name, *result, false});
    // The weights live on in the checkpoint; later stages load them from there.
    stage_plan.model.reset();
  }
  return pipeline_event(EventType::kPipelineEnd, "finished");
}

}  // namespace engine
