// Callback plugins: observers of a run (progress, metrics files, monitors). They see read-only
// events, never the mutable model.
//
// Every call is behind a fault boundary: an error or exception from a callback is logged with the
// callback's name, the event and the step, then handled by the pipeline's `on_error` for that
// callback (default DISABLE). A callback can never lose a run or its checkpoints.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

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

struct Event {
  EventType type = EventType::kStepEnd;
  std::string pipeline;
  std::string stage;
  // Optimizer steps done in this stage, and planned.
  int64_t step = 0;
  int64_t total_steps = 0;
  int64_t epoch = 0;
  // Seconds since the stage began.
  double elapsed_seconds = 0;
  // kStepEnd: "loss", "lr", "examples"; kEval: "eval/loss", "eval/accuracy", ...
  std::map<std::string, double> metrics;
  // kCheckpointSaved: the checkpoint directory.
  std::string path;
  // kError and kStageEnd: what happened, in words.
  std::string message;
};

class Callback {
 public:
  virtual ~Callback() = default;
  // Called on the training thread, in order, once per event. A returned error (or a thrown
  // exception) is handled according to the callback's `on_error`.
  virtual Status OnEvent(const Event& event) = 0;
};

class CallbackPlugin : public Plugin {
 public:
  PluginKind kind() const final { return PluginKind::kCallback; }

  virtual StatusOr<std::unique_ptr<Callback>> Create(
      const google::protobuf::Message& options) const = 0;
};

}  // namespace engine
