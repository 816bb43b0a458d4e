// Callbacks that watch an evaluation metric, checked at plan time against the metrics the stage's
// evaluation really reports, so that `engine check` (and `engine run` before step 0) refuses a
// metric the model never reports instead of the stage failing, or the callback being disabled, at
// its first evaluation.
//
// The convention: a callback whose options have a singular string field named `metric` (as
// early_stopping's do) watches the metric it names, when that name starts with "eval/". The metrics
// an evaluation reports are learned by running the model once, in eval mode without gradients, on
// one evaluation example; this happens only for stages with such a callback. When that forward
// cannot run at plan time (the model needs its precision runtime or a device), nothing is checked:
// the first evaluation still reports a wrong name.
#pragma once

#include <string>
#include <vector>

#include "pipeline/resolved_pipeline.h"
#include "plan/pipeline_plan.h"

namespace engine {

struct WatchedMetricError {
  std::string path;  // the callback reference, for the error's position
  std::string message;
};

// The callbacks of `stage` and of the whole pipeline watching a metric `plan`'s model and data do
// not report. `plan` needs its dataset and model.
std::vector<WatchedMetricError> CheckWatchedMetrics(const ResolvedPipeline& pipeline,
                                                    const ResolvedStage& stage,
                                                    const StagePlan& plan);

}  // namespace engine
