#include <glog/logging.h>

#include <iostream>

#include "cli/arguments.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "plan/plan_printer.h"
#include "run/pipeline_runner.h"

namespace engine::cli {

std::string RunHelp() {
  return R"(usage: engine run PIPELINE.pbtxt [--output_dir=DIR] [--plugin_path=DIR[:DIR...]]

Checks the pipeline exactly as `engine check` does and prints its plan; then trains the stages in
order, each into <output_dir>/<stage>/. A stage ends with an evaluation and a checkpoint in
<output_dir>/<stage>/final/ (model.safetensors, optimizer.safetensors, manifest.pbtxt); periodic
checkpoints go to <output_dir>/<stage>/checkpoints/. Checkpoints appear whole or not at all.

Exit status 0 when every stage finished, 1 when the pipeline is invalid or a stage failed (the error
says which and why), 2 for a wrong command line.

  --output_dir=DIR     write here instead of the pipeline's output_dir
  --plugin_path=DIRS   more plugin directories, searched after the built-in one and before
                       $ENGINE_PLUGIN_PATH
)";
}

int RunCommand(const std::vector<std::string>& args) {
  Arguments a = ParseArguments(args, {"output_dir", "plugin_path"}, {});
  if (a.help) {
    std::cout << RunHelp();
    return kExitOk;
  }
  if (a.error.empty() && a.positional.size() != 1) a.error = "expected one pipeline file";
  if (!a.error.empty()) {
    std::cerr << "engine run: " << a.error << "\n\n" << RunHelp();
    return kExitUsage;
  }
  LoadOptions options;
  if (a.Has("output_dir")) options.output_dir = a.Get("output_dir");
  Session session;
  if (!LoadAndPlan(a.positional[0], a.Get("plugin_path"), options, &session)) {
    std::cerr << session.diagnostics.ToString();
    std::cerr << "engine run: " << session.diagnostics.size() << " error"
              << (session.diagnostics.size() == 1 ? "" : "s") << " in " << a.positional[0]
              << "; nothing was run\n";
    return kExitFailure;
  }
  std::cout << PlanToText(*session.plan) << std::endl;
  std::vector<StageOutcome> outcomes;
  Status status = RunPipeline(session.plan.get(), std::cout, &outcomes);
  if (!status.ok()) {
    std::cerr << "engine run: " << status.message() << "\n";
    return kExitFailure;
  }
  std::cout << "pipeline '" << session.pipeline->name << "' finished: " << outcomes.size()
            << " stage" << (outcomes.size() == 1 ? "" : "s") << " in "
            << session.pipeline->output_dir.string() << std::endl;
  return kExitOk;
}

}  // namespace engine::cli
