// Renders a plan for people (text) and for programs (JSON, `engine check --format=json`).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine/format.h"
#include "plan/pipeline_plan.h"

namespace engine {

std::string PlanToText(const PipelinePlan& plan);
// The census as a table (group, role, dtype, tensors, elements, bytes), each line led by `indent`;
// with a plan, its kept-f32 tensors show as their own role.
std::string CensusText(const ParameterCensus& census, const std::string& indent,
                       const PrecisionPlan* plan = nullptr);
nlohmann::json PlanToJson(const PipelinePlan& plan);
// One stage's part of PlanToJson.
nlohmann::json StagePlanToJson(const ResolvedPipeline& pipeline, const StagePlan& stage);

// "104.5 KB".
std::string HumanBytes(int64_t bytes);

}  // namespace engine
