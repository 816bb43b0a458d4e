
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "cli/arguments.h"
#include "cli/commands.h"
#include "cli/launcher.h"
#include "core/cpu_threads.h"
#include "core/interrupt.h"
#include "core/logging.h"
#include "core/output_dir_lock.h"
#include "dist/dist_env.h"
#include "engine/utf8.h"
#include "plan/pipeline_plan.h"
#include "plan/plan_printer.h"
#include "run/pipeline_runner.h"
#include "run/pipeline_session.h"

namespace engine::cli {

std::string RunHelp() {
  return R"(usage: engine run PIPELINE.pbtxt [--force=STAGE[,STAGE...]] [--from=STAGE]
                  [--nproc=N [--oversubscribe]] [--output_dir=DIR] [--plugin_path=DIR[:DIR...]]
                  [--base_path=DIR[:DIR...]]

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
One run at a time writes an output directory: a second `engine run` on the same directory is
refused at once, naming the first one's pid and command (the lock, <output_dir>/.engine.lock, is
released by the kernel when that run ends, however it ends).
Ctrl-C (or SIGTERM) stops after the current step and writes a checkpoint to resume from; a second
Ctrl-C stops at once.

Exit status 0 when every stage finished, 1 when the pipeline is invalid or a stage failed (the error
says which and why), 2 for a wrong command line, 130 when stopped by Ctrl-C or SIGTERM.

  --force=STAGES       train these stages (comma-separated) again from step 0 even when up to date
  --from=STAGE         train STAGE and every stage after it again from step 0; the stages before it
                       are not trained, their finished checkpoints are used as they are
  --nproc=N            start N local ranks of this command for stages with
                       parallel { strategy: DDP } (Gloo over loopback), after checking the
                       pipeline once (an invalid one starts no rank): a free MASTER_PORT is picked
                       unless MASTER_PORT is set, rank 0's output is shown and every rank's errors;
                       when a rank fails the others are stopped and the exit status is its own.
                       torchrun or Slurm can start the ranks instead (RANK, WORLD_SIZE, LOCAL_RANK,
                       MASTER_ADDR, MASTER_PORT)
                       The check plans as the last rank would, so a stage without DDP, or
                       with more ranks than CUDA devices, is refused before any rank starts
  --oversubscribe      with --nproc: allow more ranks than this machine has cores for stages
                       on the CPU (each rank then gets a share of a core)
  --output_dir=DIR     write here instead of the pipeline's output_dir
  --plugin_path=DIRS   more plugin directories, searched after the built-in one and before
                       $ENGINE_PLUGIN_PATH
  --base_path=DIRS     where to look for the base of a slim checkpoint whose base moved, by its
                       content (and 3 levels below; then $ENGINE_BASE_PATH): the stage then goes
                       on from that checkpoint, or stays up to date, on the base found
)";
}

namespace {

// What the command line asks of `engine run` beyond the pipeline file.
struct RunFlags {
  RunOptions options;
  int nproc = 1;
  bool oversubscribe = false;
};

// Fills `flags` from `a`; returns what is wrong with the command line, or "".
std::string ParseRunFlags(const Arguments& a, RunFlags* flags) {
  if (!a.error.empty()) return a.error;
  if (a.positional.size() != 1) return "expected one pipeline file";
  if (a.Has("force")) {
    const std::string force = a.Get("force") + ",";
    for (size_t begin = 0, end; (end = force.find(',', begin)) != std::string::npos;
         begin = end + 1) {
      if (end == begin) return "--force needs stage names, comma-separated";
      flags->options.force.insert(force.substr(begin, end - begin));
    }
  }
  flags->options.from = a.Get("from");
  if (a.Has("from") && flags->options.from.empty()) return "--from needs a stage name";
  if (a.Has("output_dir") && a.Get("output_dir").empty()) return "--output_dir needs a directory";
  if (a.Has("nproc")) {
    const std::string text = a.Get("nproc");
    char* end = nullptr;
    errno = 0;
    const long nproc = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || nproc < 1 || nproc > 1024) {
      return "--nproc needs a number of ranks from 1 to 1024, not '" + text + "'";
    }
    flags->nproc = static_cast<int>(nproc);
  }
  flags->oversubscribe = a.Has("oversubscribe");
  if (flags->oversubscribe && flags->nproc == 1) return "--oversubscribe goes with --nproc=N";
  return "";
}

// The command line of each rank: this one without the launcher's flags.
std::vector<std::string> WithoutNproc(const std::vector<std::string>& args) {
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--nproc") {
      ++i;
    } else if (args[i].rfind("--nproc=", 0) != 0 && args[i] != "--oversubscribe") {
      rest.push_back(args[i]);
    }
  }
  return rest;
}

// While it lives, this process sees the variables the last of `nproc` local ranks will see
// (launcher.cc sets them for each rank), so that planning here meets what every rank will meet:
// the largest LOCAL_RANK, which needs its own CUDA device, and a world size above one, which a
// stage without DDP refuses.
class AsTheLastRank {
 public:
  explicit AsTheLastRank(int nproc) {
    const std::string last = std::to_string(nproc - 1), size = std::to_string(nproc);
    for (const auto& [name, value] : {std::pair<const char*, std::string>{"WORLD_SIZE", size},
                                      {"RANK", last},
                                      {"LOCAL_RANK", last},
                                      {"LOCAL_WORLD_SIZE", size}}) {
      const char* before = std::getenv(name);
      saved_.emplace_back(name,
                          before != nullptr ? std::optional<std::string>(before) : std::nullopt);
      ::setenv(name, value.c_str(), 1);
    }
  }
  ~AsTheLastRank() {
    for (const auto& [name, before] : saved_) {
      if (before) {
        ::setenv(name.c_str(), before->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  AsTheLastRank(const AsTheLastRank&) = delete;
  AsTheLastRank& operator=(const AsTheLastRank&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// More ranks than cores for a stage on the CPU, without --oversubscribe: what is wrong, else "".
std::string TooManyCpuRanks(const PipelinePlan& plan, int nproc, bool oversubscribe) {
  const int cores = ReadCpuThreadFacts(0, 1).usable_cores;
  if (oversubscribe || nproc <= cores) return "";
  for (const StagePlan& stage : plan.stages) {
    if (stage.stage->device.device == "cpu") {
      return "--nproc=" + std::to_string(nproc) + " starts more ranks than the " +
             std::to_string(cores) + " cores this process may use, and " + stage.stage->subject() +
             " runs on the CPU; use at most " + std::to_string(cores) +
             " ranks, or add --oversubscribe to share the cores among them";
    }
  }
  return "";
}

int ReportInvalid(const PipelineSession& session, const std::string& file) {
  std::cerr << session.diagnostics.ToString();
  std::cerr << "engine run: " << session.diagnostics.size() << " error"
            << (session.diagnostics.size() == 1 ? "" : "s") << " in " << file
            << "; nothing was run\n";
  return kExitFailure;
}

BaseSearch RunBaseSearch(const Arguments& a) {
  BaseSearch bases;
  bases.dirs = BaseSearchPath(a.Get("base_path"));
  return bases;
}

// Checks the pipeline once as `engine check` does (data and models included), then starts `nproc`
// ranks of this command: an invalid pipeline is reported once, without starting any. The check's
// models are freed before the ranks start; each rank plans again for itself.
int CheckThenLaunch(const std::vector<std::string>& args, const Arguments& a,
                    const RunFlags& flags) {
  if (std::getenv("WORLD_SIZE") != nullptr) return LaunchRanks(flags.nproc, WithoutNproc(args));
  {
    PipelineSession session;
    LoadOptions options;
    if (a.Has("output_dir")) options.output_dir = a.Get("output_dir");
    bool planned = false;
    {
      AsTheLastRank last(flags.nproc);
      planned = LoadAndPlanSession(a.positional[0], a.Get("plugin_path"), options, &session,
                                   PlanModels::kPlanOnly, RunBaseSearch(a));
    }
    PrintNotes(session.notes);
    if (!planned) return ReportInvalid(session, a.positional[0]);
    const std::string crowded = TooManyCpuRanks(*session.plan, flags.nproc, flags.oversubscribe);
    if (!crowded.empty()) {
      std::cerr << "engine run: " << crowded << "; nothing was run\n";
      return kExitUsage;
    }
  }
  return LaunchRanks(flags.nproc, WithoutNproc(args));
}

// The output directory's lock, taken by rank 0 (the ranks share the directory; rank 0 writes the
// checkpoints) before planning, so a second run on the same directory is refused at once.
StatusOr<std::unique_ptr<OutputDirLock>> LockOutputDir(const ResolvedPipeline& pipeline,
                                                       const std::vector<std::string>& args) {
  StatusOr<DistEnv> env = ReadDistEnv();
  if (env.ok() && env->rank != 0) return std::unique_ptr<OutputDirLock>();
  std::string holder = "engine run";
  for (const std::string& arg : args) holder += " " + arg;
  return OutputDirLock::Acquire(pipeline.output_dir, holder);
}

// Prints the plan and trains it; the exit status.
int TrainPlan(PipelineSession* session, const RunOptions& options) {
  std::cout << PlanToText(*session->plan) << std::endl;
  std::vector<StageOutcome> outcomes;
  Status status = RunPipeline(session->plan.get(), options, std::cout, &outcomes);
  if (!status.ok()) {
    std::cerr << "engine run: " << Printable(status.message()) << "\n";
    return status.code() == StatusCode::kAborted && InterruptRequested() ? kExitInterrupted
                                                                         : kExitFailure;
  }
  std::cout << "pipeline '" << session->pipeline->name << "' finished: " << outcomes.size()
            << " stage" << (outcomes.size() == 1 ? "" : "s") << " in "
            << session->pipeline->output_dir.string() << std::endl;
  return kExitOk;
}

}  // namespace

int RunCommand(const std::vector<std::string>& args) {
  const Arguments a =
      ParseArguments(args, {"output_dir", "plugin_path", "base_path", "force", "from", "nproc"},
                     {"oversubscribe"});
  if (a.help) {
    std::cout << RunHelp();
    return kExitOk;
  }
  RunFlags flags;
  if (const std::string error = ParseRunFlags(a, &flags); !error.empty()) {
    std::cerr << "engine run: " << error << "\n\n" << RunHelp();
    return kExitUsage;
  }
  if (flags.nproc > 1) return CheckThenLaunch(args, a, flags);
  InstallInterruptHandlers();
  LoadOptions options;
  if (a.Has("output_dir")) options.output_dir = a.Get("output_dir");
  PipelineSession session;
  const bool loaded =
      LoadSession(a.positional[0], a.Get("plugin_path"), options, &session, RunBaseSearch(a));
  PrintNotes(session.notes);
  if (!loaded) return ReportInvalid(session, a.positional[0]);
  // --force/--from name stages: a typo is refused before planning loads any model.
  if (Status known = CheckRunOptions(*session.pipeline, flags.options); !known.ok()) {
    std::cerr << "engine run: " << known.message() << "\n";
    return kExitUsage;
  }
  StatusOr<std::unique_ptr<OutputDirLock>> lock = LockOutputDir(*session.pipeline, args);
  if (!lock.ok()) {
    std::cerr << "engine run: " << lock.status().message() << "; nothing was run\n";
    return kExitFailure;
  }
  // One stage: planning builds its model for training, which then starts at once (planning it
  // only, then building it, would quantize a QLoRA stage twice). Several: each is planned only and
  // built when it trains, so that planning holds no stage's model while the others are planned.
  const PlanModels models =
      session.pipeline->run_order.size() == 1 ? PlanModels::kKeep : PlanModels::kPlanOnly;
  if (!PlanSession(&session, models)) {
    if (*lock) (*lock)->ReleaseUnused();
    return ReportInvalid(session, a.positional[0]);
  }
  return TrainPlan(&session, flags.options);
}

}  // namespace engine::cli
