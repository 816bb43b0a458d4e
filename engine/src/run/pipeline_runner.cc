#include "run/pipeline_runner.h"

#include <chrono>
#include <cstdio>

#include "checkpoint/checkpoint.h"
#include "core/allocator.h"
#include "core/guarded_call.h"
#include "core/interrupt.h"
#include "core/logging.h"
#include "pipeline/pretrained_dir.h"
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

std::string EvalSummary(const std::string& stage, const StageResult& result) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", result.seconds);
  std::string metrics = MetricsText(result.eval_metrics, result.eval_baselines);
  if (!metrics.empty()) metrics = ":" + metrics;
  return StageSubject(stage) + ": eval of " + WithThousands(result.eval_examples) +
         " examples in " + seconds + " s" + metrics + "; checkpoint " +
         result.final_checkpoint.string();
}

std::string StageSummary(const std::string& stage, const StageResult& result) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", result.seconds);
  std::string out =
      StageSubject(stage) + ": " + WithThousands(result.steps) + " steps in " + seconds + " s";
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
  std::string out = StageSubject(stage) + ": " + why + "; " +
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

namespace {

// The pipeline-level side of a run: its callbacks (on rank 0 only: under DDP the trainer spreads
// their stop requests to the other ranks) and its begin and end events.
class PipelineEvents {
 public:
  explicit PipelineEvents(const ResolvedPipeline& pipeline)
      : pipeline_(pipeline), start_(std::chrono::steady_clock::now()) {}

  Status Begin(bool leader) {
    if (leader) {
      ENGINE_RETURN_IF_ERROR(MakeCallbacks(
          pipeline_.callbacks, {pipeline_.name, pipeline_.base_dir, pipeline_.output_dir, ""},
          &callbacks_));
    }
    return Send(EventType::kPipelineBegin, "");
  }
  Status Finish() { return Send(EventType::kPipelineEnd, "finished"); }
  // Tells the callbacks the run failed, and returns `status`.
  Status Fail(Status status) {
    Send(EventType::kPipelineEnd, "failed: " + status.message()).IgnoreError();
    return status;
  }
  CallbackRunner* callbacks() { return &callbacks_; }

 private:
  Status Send(EventType type, std::string message) {
    Event event;
    event.type = type;
    event.pipeline = pipeline_.name;
    event.message = std::move(message);
    event.elapsed_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    return callbacks_.Dispatch(event, actions_);
  }

  const ResolvedPipeline& pipeline_;
  const std::chrono::steady_clock::time_point start_;
  CallbackRunner callbacks_;
  PipelineActions actions_;
};

// One pass over the plan's stages in run order.
class PipelineRun {
 public:
  PipelineRun(PipelinePlan* plan, const RunOptions& options, std::ostream& out,
              std::vector<StageOutcome>* outcomes)
      : plan_(*plan),
        pipeline_(*plan->pipeline),
        options_(options),
        out_(out),
        outcomes_(outcomes),
        events_(pipeline_),
        leader_(plan->stages.empty() || plan->stages.front().rank == 0),
        from_reached_(options.from.empty()) {}

  Status Run() {
    ENGINE_RETURN_IF_ERROR(events_.Begin(leader_));
    for (StagePlan& stage_plan : plan_.stages) {
      const ResolvedStage& stage = *stage_plan.stage;
      if (InterruptRequested()) {
        return events_.Fail(AbortedError("interrupted by " + InterruptSignalName() + " before " +
                                         stage.subject() +
                                         ". Run the same command again to go on"));
      }
      if (stage.name == options_.from) from_reached_ = true;
      const StageDecision decision = Decide(stage_plan);
      Status done = decision.action == StageDecision::Action::kReuse ? Reuse(stage_plan, decision)
                    : decision.action == StageDecision::Action::kRefuse
                        ? decision.refusal
                        : Train(stage_plan, decision);
      if (!done.ok()) return events_.Fail(done);
      // The weights live on in the checkpoint; later stages load them from there.
      stage_plan.model.reset();
      ReturnFreedMemory();
    }
    return events_.Finish();
  }

 private:
  std::filesystem::path StageDir(const ResolvedStage& stage) const {
    return pipeline_.output_dir / stage.name;
  }

  StageDecision Decide(const StagePlan& stage_plan) {
    const ResolvedStage& stage = *stage_plan.stage;
    StageSituation situation;
    situation.stage = stage.name;
    situation.stage_dir = StageDir(stage);
    situation.base_dir = StagePretrainedDir(stage, pipeline_.base_dir);
    situation.fingerprint = stage_plan.fingerprint;
    if (stage.from_stage) situation.parent_run_id = final_run_ids_[*stage.from_stage];
    situation.forced =
        options_.force.count(stage.name) > 0 || (!options_.from.empty() && from_reached_);
    situation.before_from = !from_reached_;
    situation.from = options_.from;
    situation.any_world_fingerprint = stage_plan.any_world_fingerprint;
    situation.another_schedule = [&stage_plan](const ResumePoint& point) {
      return AnotherScheduleRefusal(stage_plan, point);
    };
    return DecideStage(situation);
  }

  // A periodic checkpoint of this stage written on another schedule (another world size): what it
  // was, what this run would make, and how to resume from it or start over.
  static std::string AnotherScheduleRefusal(const StagePlan& plan, const ResumePoint& point) {
    const ResolvedStage& stage = *plan.stage;
    const proto::RanksInfo& then = point.manifest.ranks();
    const int64_t examples = static_cast<int64_t>(then.examples_per_step());
    const int64_t steps = static_cast<int64_t>(then.steps_per_epoch());
    const int64_t epoch = static_cast<int64_t>(then.epoch_examples());
    const bool drop_last = stage.config->schedule().drop_last();
    auto same_schedule = [&](int64_t batch, int64_t accumulation) {
      const RankSchedule s =
          ScheduleAt(plan.train_examples, plan.world_size, batch, accumulation, drop_last);
      return s.examples_per_step == examples && s.steps_per_epoch == steps &&
             s.epoch_examples == epoch;
    };
    const int64_t ranks = plan.world_size;
    const int64_t accumulation = plan.gradient_accumulation_steps;
    const std::string at_ranks = " to resume from it at " + std::to_string(ranks) + " ranks";
    std::string way_out;
    if (examples % (ranks * accumulation) == 0 &&
        same_schedule(examples / (ranks * accumulation), accumulation)) {
      way_out = "set schedule.batch_size to " + std::to_string(examples / (ranks * accumulation)) +
                at_ranks;
    } else if (examples % (ranks * plan.batch_size) == 0 &&
               same_schedule(plan.batch_size, examples / (ranks * plan.batch_size))) {
      way_out = "set schedule.gradient_accumulation_steps to " +
                std::to_string(examples / (ranks * plan.batch_size)) + at_ranks;
    } else {
      way_out = "resume from it at " + std::to_string(then.world_size()) + " ranks of batch_size " +
                std::to_string(then.batch_size()) + " x " +
                std::to_string(then.gradient_accumulation_steps()) +
                " accumulation (neither batch_size nor accumulation alone makes that schedule at " +
                std::to_string(ranks) + " ranks)";
    }
    return stage.subject() + ": its checkpoint " + point.dir.string() + " (after step " +
           std::to_string(point.manifest.step()) + " of " +
           std::to_string(point.manifest.total_steps()) + ") was written by " +
           std::to_string(then.world_size()) + " ranks of batch_size " +
           std::to_string(then.batch_size()) + " x " +
           std::to_string(then.gradient_accumulation_steps()) +
           " accumulation: " + std::to_string(examples) + " examples per step, " +
           std::to_string(steps) + " steps per epoch of " + std::to_string(epoch) + " examples; " +
           std::to_string(ranks) + " ranks of batch_size " + std::to_string(plan.batch_size) +
           " x " + std::to_string(accumulation) + " make " + std::to_string(plan.global_batch) +
           ", " + std::to_string(plan.steps_per_epoch) + " and " +
           std::to_string(plan.epoch_examples) + ". To go on, " + way_out +
           ", or run with --force=" + stage.name + " to train the stage again from step 0";
  }

  Status Reuse(const StagePlan& stage_plan, const StageDecision& decision) {
    const ResolvedStage& stage = *stage_plan.stage;
    const std::filesystem::path final_dir = FinalCheckpointDir(StageDir(stage));
    out_ << ReusedStageSummary(stage.name, decision.why, *decision.manifest, final_dir)
         << std::endl;
    final_run_ids_[stage.index] = decision.manifest->run_id();
    if (outcomes_ != nullptr) {
      StageOutcome outcome{stage.name, {}, true};
      outcome.result.steps = static_cast<int64_t>(decision.manifest->step());
      outcome.result.final_checkpoint = final_dir;
      outcome.result.eval_metrics.insert(decision.manifest->metrics().begin(),
                                         decision.manifest->metrics().end());
      outcomes_->push_back(std::move(outcome));
    }
    return Status::Ok();
  }

  Status Train(StagePlan& stage_plan, const StageDecision& decision) {
    const ResolvedStage& stage = *stage_plan.stage;
    if (!decision.why.empty())
      out_ << stage.subject() << ": training again: " << decision.why << std::endl;
    for (const std::string& note : decision.notes) {
      LOG(WARNING) << stage.subject() << ": not resuming from " << note;
      out_ << stage.subject() << ": not resuming from " << note << std::endl;
    }
    CallbackRunner stage_callbacks;
    if (leader_) {
      ENGINE_RETURN_IF_ERROR(MakeCallbacks(
          stage.callbacks, {pipeline_.name, pipeline_.base_dir, StageDir(stage), stage.name},
          &stage_callbacks));
    }
    StageRunRequest request;
    request.pipeline = &pipeline_;
    request.plan = &stage_plan;
    request.stage_dir = StageDir(stage);
    request.callbacks = {&stage_callbacks, events_.callbacks()};
    request.out = &out_;
    if (stage.from_stage) {
      request.parent_checkpoint = FinalCheckpointDir(StageDir(pipeline_.stages[*stage.from_stage]));
      request.parent_run_id = final_run_ids_[*stage.from_stage];
    }
    request.run_id = decision.resume ? decision.resume->manifest.run_id() : NewRunId();
    if (decision.resume) {
      request.resume_from = decision.resume->dir;
      out_ << stage.subject() << ": resuming after step "
           << WithThousands(static_cast<int64_t>(decision.resume->manifest.step())) << " of "
           << WithThousands(stage_plan.total_steps) << " from " << decision.resume->dir.string()
           << std::endl;
    }
    // Planning built it for the plan only (PlanModels::kPlanOnly).
    if (stage_plan.model == nullptr) {
      ENGINE_RETURN_IF_ERROR(BuildStageModel(pipeline_, &stage_plan));
    }
    LOG(INFO) << stage.subject() << ": training " << stage_plan.total_steps << " steps on "
              << stage.device.device;
    ENGINE_ASSIGN_OR_RETURN(StageResult result, TrainStage(request));
    final_run_ids_[stage.index] = request.run_id;
    out_ << StageSummary(stage.name, result) << std::endl;
    if (outcomes_ != nullptr) outcomes_->push_back({stage.name, std::move(result), false});
    return Status::Ok();
  }

  PipelinePlan& plan_;
  const ResolvedPipeline& pipeline_;
  const RunOptions& options_;
  std::ostream& out_;
  std::vector<StageOutcome>* outcomes_;
  PipelineEvents events_;
  const bool leader_;
  bool from_reached_;
  // The run_id of each stage's final checkpoint once it is known (reused or trained now).
  std::map<int, std::string> final_run_ids_;
};

}  // namespace

Status RunPipeline(PipelinePlan* plan, const RunOptions& options, std::ostream& out,
                   std::vector<StageOutcome>* outcomes) {
  ENGINE_RETURN_IF_ERROR(CheckRunOptions(*plan->pipeline, options));
  return PipelineRun(plan, options, out, outcomes).Run();
}

}  // namespace engine
