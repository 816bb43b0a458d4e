#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/arguments.h"
#include "cli/commands.h"
#include "engine/json_text.h"
#include "plan/plan_printer.h"
#include "run/pipeline_session.h"

namespace engine::cli {

std::string CheckHelp() {
  return R"(usage: engine check PIPELINE.pbtxt [--format=text|json] [--plugin_path=DIR[:DIR...]]
                    [--base_path=DIR[:DIR...]]

Reads a pipeline, loads its plugins, checks every stage (plugin options, value ranges, the stage
graph, data, model, trainable selection, precision) and prints the plan of each stage: model,
trainable and frozen parameters, data sizes, steps per epoch and in total, optimizer and schedule,
and the dtype of every parameter group. Nothing is written.

Exit status 0 when the pipeline can run. Otherwise every problem found is printed to stderr as
"file:line:col: error: message" and the exit status is 1.

  --format=text|json   how the plan is printed (json: {"valid": ..., "plan" | "errors": ...})
  --plugin_path=DIRS   more plugin directories, searched after the built-in one and before
                       $ENGINE_PLUGIN_PATH
  --base_path=DIRS     where to look for the base of a slim checkpoint whose base moved, by its
                       content (and 3 levels below; then $ENGINE_BASE_PATH)
)";
}

int CheckCommand(const std::vector<std::string>& args) {
  Arguments a = ParseArguments(args, {"format", "plugin_path", "base_path"}, {});
  if (a.help) {
    std::cout << CheckHelp();
    return kExitOk;
  }
  const std::string format = ReadTextOrJsonFormat(&a);
  if (a.error.empty() && a.positional.size() != 1) a.error = "expected one pipeline file";
  if (!a.error.empty()) {
    std::cerr << "engine check: " << a.error << "\n\n" << CheckHelp();
    return kExitUsage;
  }
  PipelineSession session;
  // The plan is printed, not run: each stage's model is released as soon as the stage is planned
  // (later stages check their handoff against the names and shapes the plan keeps).
  BaseSearch bases;
  bases.dirs = BaseSearchPath(a.Get("base_path"));
  const bool ok = LoadAndPlanSession(a.positional[0], a.Get("plugin_path"), LoadOptions{}, &session,
                                     PlanModels::kPlanOnly, bases);
  PrintNotes(session.notes);
  if (!ok) {
    std::cerr << session.diagnostics.ToString();
    std::cerr << "engine check: " << session.diagnostics.size() << " error"
              << (session.diagnostics.size() == 1 ? "" : "s") << " in " << a.positional[0] << "\n";
    if (format == "json") {
      nlohmann::json errors = nlohmann::json::array();
      for (const Diagnostic& d : session.diagnostics.entries()) {
        errors.push_back({{"file", d.location.file},
                          {"line", d.location.line},
                          {"column", d.location.column},
                          {"message", d.message}});
      }
      std::cout << JsonText({{"valid", false}, {"errors", errors}}, 2) << "\n";
    }
    return kExitFailure;
  }
  if (format == "json") {
    std::cout << JsonText({{"valid", true}, {"plan", PlanToJson(*session.plan)}}, 2) << "\n";
  } else {
    std::cout << PlanToText(*session.plan);
  }
  return kExitOk;
}

}  // namespace engine::cli
