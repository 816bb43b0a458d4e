// Callback plugins: observers of a run (progress, metrics files, TensorBoard, monitors). They see
// read-only events (metrics, memory statistics, the plan), never the mutable model. What they may
// ask of the run goes through CallbackActions: stop the stage early, or write a checkpoint now.
//
// Callbacks named in a stage see that stage's events; callbacks named at the pipeline's top level
// see the pipeline's begin and end and every stage's events.
//
// Every call is behind a fault boundary: an error or exception from a callback is logged with the
// callback's name, the event and the step, then handled by the pipeline's `on_error` for that
// callback (default DISABLE). A callback can never lose a run or its checkpoints.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "engine/paths.h"
#include "engine/plugin.h"

namespace engine {

enum class EventType {
  kPipelineBegin,
  kPipelineEnd,
  kStageBegin,
  kStageEnd,
  kStepEnd,
  kEval,
  kCheckpointSaved,
  kError,
};

std::string_view EventTypeName(EventType type);

// Memory of the process, read from the operating system and the allocators; never by walking
// objects.
struct MemoryStats {
  int64_t rss_bytes = 0;       // resident now
  int64_t peak_rss_bytes = 0;  // resident at most, since the process started
  bool cuda = false;           // whether the cuda_* fields are filled
  int64_t cuda_allocated_bytes = 0;
  int64_t cuda_reserved_bytes = 0;
  int64_t cuda_peak_allocated_bytes = 0;
};

// Reads MemoryStats for this process (CUDA fields when LibTorch has CUDA and a device is in use).
MemoryStats ReadMemoryStats();

struct Event {
  EventType type = EventType::kStepEnd;
  std::string pipeline;
  std::string stage;  // empty for pipeline events
  // Optimizer steps done in this stage, and planned.
  int64_t step = 0;
  int64_t total_steps = 0;
  int64_t epoch = 0;
  // Seconds since the stage (pipeline events: the pipeline) began.
  double elapsed_seconds = 0;
  // kStepEnd: "loss", "lr", "examples" (and "grad_norm", "loss_scale", "skipped_steps" when they
  // apply); kEval and kStageEnd: "eval/loss", "eval/accuracy", ...
  std::map<std::string, double> metrics;
  // kStepEnd and kStageEnd.
  MemoryStats memory;
  // kCheckpointSaved: the checkpoint directory.
  std::string path;
  // kStageBegin: the stage's plan, as `engine check --format=json` prints one stage.
  std::string plan_json;
  // kError, kStageEnd and kPipelineEnd: what happened, in words.
  std::string message;
};

// What a callback may ask of the run. Requests take effect after the current event.
class CallbackActions {
 public:
  virtual ~CallbackActions() = default;
  // Ends the stage as if its last step had been reached: the final evaluation and checkpoint still
  // happen, and the manifest records `reason`.
  virtual void RequestStop(const std::string& reason) = 0;
  // Writes a periodic checkpoint after this step.
  virtual void RequestCheckpoint() = 0;
};

// Where a callback is used.
struct CallbackContext {
  std::string pipeline;
  // Relative paths in options resolve against this directory (the pipeline file's).
  std::filesystem::path base_dir;
  // <output_dir> for pipeline callbacks, <output_dir>/<stage> for stage callbacks.
  std::filesystem::path output_dir;
  // Empty for pipeline callbacks.
  std::string stage;

  // Where a callback writes the file or directory its options name: `option` (relative to base_dir)
  // when given, else `default_name` inside output_dir. Every file-writing callback follows this
  // rule, so a pipeline callback's log and a stage callback's land where users look for them.
  std::filesystem::path OutputPath(const std::string& option, const char* default_name) const {
    return ResolvePath(base_dir,
                       option.empty() ? output_dir / default_name : std::filesystem::path(option));
  }
};

class Callback {
 public:
  virtual ~Callback() = default;
  // Called on the training thread, in order, once per event. A returned error (or a thrown
  // exception) is handled according to the callback's `on_error`.
  virtual Status OnEvent(const Event& event, CallbackActions& actions) = 0;

  // What must survive a resume, as text (early stopping's best score and how long it has waited);
  // empty when nothing. Called on the training thread whenever a checkpoint is written.
  virtual std::string SaveState() const { return ""; }
  // Puts back what SaveState() returned into the checkpoint a resumed stage starts from; called
  // after the stage_begin event. An error leaves the callback starting afresh, with a warning.
  virtual Status RestoreState(const std::string& /*state*/) { return Status::Ok(); }
};

class CallbackPlugin : public Plugin {
 public:
  PluginKind kind() const final { return PluginKind::kCallback; }

  virtual StatusOr<std::unique_ptr<Callback>> Create(const google::protobuf::Message& options,
                                                     const CallbackContext& context) const = 0;
};

}  // namespace engine
