// `engine run`: trains the stages of a checked plan in order, each into <output_dir>/<stage>/,
// handing a stage's final weights to the stages that start from it.
#pragma once

#include <ostream>
#include <vector>

#include "plan/pipeline_plan.h"
#include "train/trainer.h"

namespace engine {

struct StageOutcome {
  std::string stage;
  StageResult result;
};

// Runs every stage of `plan`; `out` receives one summary line per stage. Stops at the first stage
// that fails, with that stage's error.
Status RunPipeline(PipelinePlan* plan, std::ostream& out, std::vector<StageOutcome>* outcomes);

// "stage 'train': 900 steps in 3.1 s; eval loss 0.0912, accuracy 0.9694; checkpoint <dir>".
std::string StageSummary(const std::string& stage, const StageResult& result);

}  // namespace engine
