
#include <cstdlib>
#include <iostream>

#include "cli/arguments.h"
#include "cli/commands.h"
#include "cli/launcher.h"
#include "cli/session.h"
#include "core/interrupt.h"
#include "core/logging.h"
#include "plan/plan_printer.h"
#include "run/pipeline_runner.h"

namespace engine::cli {

std::string RunHelp() {
  return R"(usage: engine run PIPELINE.pbtxt [--force=STAGE[,STAGE...]] [--from=STAGE]
                  [--nproc=N] [--output_dir=DIR] [--plugin_path=DIR[:DIR...]]

Checks the pipeline exactly as `engine check` does and prints its plan; then trains the stages in
order, each into <output_dir>/<stage>/. A stage ends with an evaluation and a checkpoint in
<output_dir>/<stage>/final/ (model.safetensors, optimizer.safetensors, manifest.pbtxt); periodic
checkpoints go to <output_dir>/<stage>/checkpoints/. Checkpoints appear whole or not at all.

Running the same pipeline again does only what is left to do:
  - a stage whose finished checkpoint is up to date is not trained again ("up to date"): same
    fingerprint (its configuration, plugin versions and options, data, seed, and the stages it
    comes after), started from its parent's current weights, and its files whole;
  - a stage that was stopped (Ctrl-C, a crash, a kill) goes on from its newest periodic checkpoint
    with optimizer state, and ends with the same weights as a run that was never stopped;
  - anything else trains from step 0, and so do the stages that start from a stage trained now.
Ctrl-C (or SIGTERM) stops after the current step and writes a checkpoint to resume from; a second
Ctrl-C stops at once.

Exit status 0 when every stage finished, 1 when the pipeline is invalid or a stage failed (the error
says which and why), 2 for a wrong command line, 130 when stopped by Ctrl-C or SIGTERM.

  --force=STAGES       train these stages (comma-separated) again from step 0 even when up to date
  --from=STAGE         train STAGE and every stage after it again from step 0; the stages before it
                       are not trained, their finished checkpoints are used as they are
  --nproc=N            start N local ranks of this command for stages with
                       parallel { strategy: DDP } (Gloo over loopback): a free MASTER_PORT is picked
                       unless MASTER_PORT is set, rank 0's output is shown and every rank's errors;
                       when a rank fails the others are stopped and the exit status is its own.
                       torchrun or Slurm can start the ranks instead (RANK, WORLD_SIZE, LOCAL_RANK,
                       MASTER_ADDR, MASTER_PORT)
  --output_dir=DIR     write here instead of the pipeline's output_dir
  --plugin_path=DIRS   more plugin directories, searched after the built-in one and before
                       $ENGINE_PLUGIN_PATH
)";
}

int RunCommand(const std::vector<std::string>& args) {
  Arguments a = ParseArguments(args, {"output_dir", "plugin_path", "force", "from", "nproc"}, {});
  if (a.help) {
    std::cout << RunHelp();
    return kExitOk;
  }
  if (a.error.empty() && a.positional.size() != 1) a.error = "expected one pipeline file";
  RunOptions run_options;
  if (a.error.empty() && a.Has("force")) {
    const std::string force = a.Get("force") + ",";
    for (size_t begin = 0, end; (end = force.find(',', begin)) != std::string::npos;
         begin = end + 1) {
      if (end == begin) {
        a.error = "--force needs stage names, comma-separated";
        break;
      }
      run_options.force.insert(force.substr(begin, end - begin));
    }
  }
  run_options.from = a.Get("from");
  if (a.error.empty() && a.Has("from") && run_options.from.empty()) {
    a.error = "--from needs a stage name";
  }
  if (!a.error.empty()) {
    std::cerr << "engine run: " << a.error << "\n\n" << RunHelp();
    return kExitUsage;
  }
  if (a.Has("nproc")) {
    const std::string text = a.Get("nproc");
    char* end = nullptr;
    const long nproc = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || nproc < 1 || nproc > 1024) {
      std::cerr << "engine run: --nproc needs a number of ranks from 1 to 1024, not '" << text
                << "'\n";
      return kExitUsage;
    }
    if (nproc > 1) {
      std::vector<std::string> rest;
      for (size_t i = 0; i < args.size(); ++i) {
        if (args[i] == "--nproc") {
          ++i;
        } else if (args[i].rfind("--nproc=", 0) != 0) {
          rest.push_back(args[i]);
        }
      }
      return LaunchRanks(static_cast<int>(nproc), rest);
    }
  }
  InstallInterruptHandlers();
  LoadOptions options;
  if (a.Has("output_dir")) options.output_dir = a.Get("output_dir");
  Session session;
  auto failed = [&] {
    std::cerr << session.diagnostics.ToString();
    std::cerr << "engine run: " << session.diagnostics.size() << " error"
              << (session.diagnostics.size() == 1 ? "" : "s") << " in " << a.positional[0]
              << "; nothing was run\n";
    return kExitFailure;
  };
  if (!Load(a.positional[0], a.Get("plugin_path"), options, &session)) return failed();
  // --force/--from name stages: a typo is refused before planning loads any model.
  if (Status known = CheckRunOptions(*session.pipeline, run_options); !known.ok()) {
    std::cerr << "engine run: " << known.message() << "\n";
    return kExitUsage;
  }
  if (!Plan(&session)) return failed();
  std::cout << PlanToText(*session.plan) << std::endl;
  std::vector<StageOutcome> outcomes;
  Status status = RunPipeline(session.plan.get(), run_options, std::cout, &outcomes);
  if (!status.ok()) {
    std::cerr << "engine run: " << status.message() << "\n";
    return status.code() == StatusCode::kAborted && InterruptRequested() ? kExitInterrupted
                                                                         : kExitFailure;
  }
  std::cout << "pipeline '" << session.pipeline->name << "' finished: " << outcomes.size()
            << " stage" << (outcomes.size() == 1 ? "" : "s") << " in "
            << session.pipeline->output_dir.string() << std::endl;
  return kExitOk;
}

}  // namespace engine::cli
