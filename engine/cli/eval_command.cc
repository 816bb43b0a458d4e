#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "cli/arguments.h"
#include "cli/commands.h"
#include "engine/json_text.h"
#include "pipeline/resolved_pipeline.h"
#include "run/pipeline_runner.h"
#include "run/pipeline_session.h"
#include "train/stage_logits.h"
#include "train/trainer.h"

namespace engine::cli {

std::string EvalHelp() {
  return R"(usage: engine eval PIPELINE.pbtxt [--stage=STAGE] [--checkpoint=DIR] [--format=text|json]
                   [--logits=FILE [--examples=N] [--split=eval|train]] [--output_dir=DIR]
                   [--plugin_path=DIR[:DIR...]] [--base_path=DIR[:DIR...]]

Evaluates a trained stage without training it: the pipeline is checked and planned as `engine check`
does, the stage's model is built as its training built it (layers, adapters, precision), its
weights are read from the checkpoint, and the stage's evaluation runs on its eval split. The metrics
are the ones the run reported for the same checkpoint, with the data's baselines beside them.
Nothing is written.

Exit status 0 when the evaluation ran, 1 when the pipeline is invalid or the checkpoint missing,
unfinished or damaged (its files are checked against the sizes and content hashes of its manifest),
2 for a wrong command line.

  --stage=STAGE        the stage to evaluate (default: the last stage in run order)
  --checkpoint=DIR     a checkpoint of that stage (default: <output_dir>/<stage>/final)
  --format=text|json   json: {"stage", "checkpoint", "eval_examples", "metrics", "baselines"};
                       with --logits: {"stage", "checkpoint", "logits", "examples", "shape"}
  --logits=FILE        instead of evaluating, writes the model's logits on the first examples of
                       the eval split to FILE (safetensors): input_ids, attention_mask, labels,
                       position_ids (those the model used), logits (f32 [batch, positions,
                       vocabulary]) and, with images, pixel_values and image_grid_thw as
                       transformers' processors lay them out, so another library can be run on
                       the same inputs (with `packing`, attention_mask holds the data's segment
                       ids, which transformers does not read as separate documents); FILE is
                       replaced
  --examples=N         with --logits: that many examples (default: one eval batch)
  --split=eval|train   with --logits: the examples of the eval split (default) or of the training
                       split (in the data's order, not a step's), as another library would train
                       on them
  --output_dir=DIR     the pipeline's outputs are here instead of its output_dir
  --plugin_path=DIRS   more plugin directories, searched after the built-in one and before
                       $ENGINE_PLUGIN_PATH
  --base_path=DIRS     where to look for the base of a slim checkpoint whose base moved, by its
                       content (and 3 levels below; then $ENGINE_BASE_PATH)
)";
}

namespace {

// Writes the stage's logits to `file` and says so; the exit status.
int WriteLogits(const StageRunRequest& request, const std::filesystem::path& checkpoint,
                int64_t examples, Split split, const std::filesystem::path& file,
                const std::string& format) {
  StatusOr<StageLogits> logits = ComputeStageLogits(request, checkpoint, examples, split);
  Status written =
      logits.ok() ? safetensors::Write(file, logits->tensors, logits->metadata) : logits.status();
  if (!written.ok()) {
    std::cerr << "engine eval: " << written.message() << "\n";
    return kExitFailure;
  }
  std::vector<int64_t> shape;
  for (const auto& [name, tensor] : logits->tensors) {
    if (name == "logits") shape = tensor.sizes().vec();
  }
  const std::string& stage = request.plan->stage->name;
  if (format == "json") {
    std::cout << JsonText(nlohmann::json{{"stage", stage},
                                         {"checkpoint", checkpoint.string()},
                                         {"logits", file.string()},
                                         {"examples", shape.at(0)},
                                         {"shape", shape}},
                          2)
              << "\n";
  } else {
    std::cout << "stage '" << stage << "': logits of " << shape.at(0) << " " << SplitName(split)
              << " examples (" << shape.at(1) << " positions, " << shape.at(2)
              << " ids) written to " << file.string() << "\n";
  }
  return kExitOk;
}

nlohmann::json EvalJson(const std::string& stage, const StageResult& result) {
  return {{"stage", stage},
          {"checkpoint", result.final_checkpoint.string()},
          {"eval_examples", result.eval_examples},
          {"metrics", result.eval_metrics},
          {"baselines", result.eval_baselines}};
}

}  // namespace

int EvalCommand(const std::vector<std::string>& args) {
  Arguments a = ParseArguments(args,
                               {"stage", "checkpoint", "format", "output_dir", "plugin_path",
                                "base_path", "logits", "examples", "split"},
                               {});
  if (a.help) {
    std::cout << EvalHelp();
    return kExitOk;
  }
  const std::string format = ReadTextOrJsonFormat(&a);
  if (a.error.empty() && a.positional.size() != 1) a.error = "expected one pipeline file";
  if (a.error.empty() && a.values.count("output_dir") && a.Get("output_dir").empty()) {
    a.error = "--output_dir is empty";
  }
  const bool logits = a.values.count("logits") != 0;
  int64_t examples = 0;
  if (a.error.empty() && a.values.count("examples")) {
    if (!logits) a.error = "--examples goes with --logits";
    ReadIntFlag("examples", 1, 1 << 20, &a, &examples);
  }
  Split split = Split::kEval;
  if (a.error.empty() && a.values.count("split") && !logits) a.error = "--split goes with --logits";
  ReadSplitFlag(&a, &split);
  std::filesystem::path logits_file;
  if (a.error.empty() && logits) {
    std::error_code ec;
    if (a.Get("logits").empty()) {
      a.error = "--logits is empty";
    } else if (logits_file = std::filesystem::absolute(a.Get("logits"), ec); ec) {
      a.error = "--logits=" + a.Get("logits") + ": " + ec.message();
    } else if (std::filesystem::is_directory(logits_file, ec)) {
      a.error = "--logits=" + a.Get("logits") + " is a directory; name the file to write";
    } else if (!std::filesystem::is_directory(logits_file.parent_path(), ec)) {
      a.error = "--logits=" + a.Get("logits") + ": the directory " +
                logits_file.parent_path().string() + " does not exist";
    }
  }
  if (!a.error.empty()) {
    std::cerr << "engine eval: " << a.error << "\n\n" << EvalHelp();
    return kExitUsage;
  }
  LoadOptions options;
  if (a.values.count("output_dir")) options.output_dir = a.Get("output_dir");
  BaseSearch bases;
  bases.dirs = BaseSearchPath(a.Get("base_path"));
  if (a.values.count("checkpoint"))
    bases.checkpoint = std::filesystem::absolute(a.Get("checkpoint"));
  PipelineSession session;
  const bool planned = LoadAndPlanSession(a.positional[0], a.Get("plugin_path"), options, &session,
                                          PlanModels::kPlanOnly, bases);
  PrintNotes(session.notes);
  if (!planned) {
    std::cerr << session.diagnostics.ToString();
    return kExitFailure;
  }
  StatusOr<const StagePlan*> found = FindStagePlan(*session.plan, a.Get("stage"));
  if (!found.ok()) {
    std::cerr << "engine eval: " << found.status().message() << "\n";
    return kExitFailure;
  }
  const StagePlan* stage_plan = *found;
  const ResolvedStage& stage = *stage_plan->stage;
  const std::filesystem::path checkpoint =
      a.values.count("checkpoint") ? std::filesystem::absolute(a.Get("checkpoint"))
                                   : FinalCheckpointDir(session.pipeline->output_dir / stage.name);
  StageRunRequest request;
  request.pipeline = session.pipeline.get();
  request.plan = const_cast<StagePlan*>(stage_plan);
  request.stage_dir = session.pipeline->output_dir / stage.name;
  Status checked = CheckStageCheckpoint(session, stage, checkpoint);
  if (checked.ok()) checked = StagePlanWithModel(&session, stage.name).status();
  if (checked.ok() && logits)
    return WriteLogits(request, checkpoint, examples, split, logits_file, format);
  StatusOr<StageResult> result =
      checked.ok() ? EvaluateStage(request, checkpoint) : StatusOr<StageResult>(checked);
  if (!result.ok()) {
    std::cerr << "engine eval: " << result.status().message() << "\n";
    return kExitFailure;
  }
  if (format == "json") {
    std::cout << JsonText(EvalJson(stage.name, *result), 2) << "\n";
  } else {
    std::cout << EvalSummary(stage.name, *result) << "\n";
  }
  return kExitOk;
}

}  // namespace engine::cli
