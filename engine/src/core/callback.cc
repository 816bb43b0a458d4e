#include "engine/callback.h"

namespace engine {

std::string_view EventTypeName(EventType type) {
  switch (type) {
    case EventType::kPipelineBegin:
      return "pipeline_begin";
    case EventType::kPipelineEnd:
      return "pipeline_end";
    case EventType::kStageBegin:
      return "stage_begin";
    case EventType::kStageEnd:
      return "stage_end";
    case EventType::kStepEnd:
      return "step_end";
    case EventType::kEval:
      return "eval";
    case EventType::kCheckpointSaved:
      return "checkpoint_saved";
    case EventType::kError:
      return "error";
  }
  return "unknown";
}

}  // namespace engine
