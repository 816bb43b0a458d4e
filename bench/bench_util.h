// Running one pipeline in-process for benchmarks: plan and train it as `engine run` does, quietly.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "pipeline/pipeline_loader.h"
#include "plan/pipeline_plan.h"
#include "plugins/search_path.h"
#include "run/pipeline_runner.h"

namespace engine::bench {

// Writes `text` to dir/bench.pbtxt, plans and runs it; exits on any error. Returns the first
// stage's result and, if asked, its plan's precision policy.
inline StageResult RunStage(const std::filesystem::path& dir, const std::string& text,
                            std::string* policy = nullptr) {
  std::filesystem::create_directories(dir);
  const auto file = dir / "bench.pbtxt";
  std::ofstream(file) << text;
  static PluginRegistry* registry = [] {
    auto* r = new PluginRegistry();
    if (!r->LoadSearchPath(PluginSearchPath({})).ok()) std::abort();
    return r;
  }();
  Diagnostics diagnostics;
  auto pipeline = LoadPipeline(file, {}, registry, &diagnostics);
  auto plan = pipeline ? BuildPlan(*pipeline, &diagnostics) : nullptr;
  if (plan == nullptr) {
    std::cerr << diagnostics.ToString();
    std::exit(1);
  }
  if (policy != nullptr) *policy = plan->stages[0].precision.policy;
  std::ostringstream sink;
  std::vector<StageOutcome> outcomes;
  // Every stage trains, even when an earlier run left it up to date.
  RunOptions options;
  for (const StagePlan& stage : plan->stages) options.force.insert(stage.stage->name);
  Status status = RunPipeline(plan.get(), options, sink, &outcomes);
  if (!status.ok()) {
    std::cerr << status.message() << "\n";
    std::exit(1);
  }
  return outcomes[0].result;
}

// A digits stage with an MLP of `hidden` (" hidden_units: 512 hidden_units: 512").
inline std::string DigitsMlpPipeline(const std::filesystem::path& out, const std::string& data,
                                     const std::string& hidden, const std::string& stage_extra) {
  return "output_dir: \"" + out.string() +
         "\"\nstage { name: \"bench\"\n"
         "  model { plugin: \"mlp\" options { [type.googleapis.com/engine.plugins.MlpOptions] {" +
         hidden +
         " } } }\n"
         "  data { plugin: \"digits\" options { [type.googleapis.com/engine.plugins.DigitsOptions] "
         "{ path: \"" +
         data +
         "\" } } }\n"
         "  checkpoint { save_optimizer_state: false }\n" +
         stage_extra + "\n}\n";
}

// The engine's step by phase (train/step_phases.h), in ms per step, on one indented line; "other"
// is the rest of `engine_seconds` (the stage's set-up, the loop itself).
inline void PrintStepPhases(const StepPhaseSeconds& p, double engine_seconds, int64_t steps) {
  const double per_step = 1e3 / static_cast<double>(std::max<int64_t>(1, steps));
  const double other =
      engine_seconds - p.batch - p.forward - p.backward - p.host_read - p.update - p.callbacks;
  std::printf(
      "  engine ms/step: batch %.3f, forward %.3f, backward %.3f, host read %.3f, update %.3f, "
      "callbacks %.3f, other %.3f\n",
      p.batch * per_step, p.forward * per_step, p.backward * per_step, p.host_read * per_step,
      p.update * per_step, p.callbacks * per_step, other * per_step);
}

}  // namespace engine::bench
