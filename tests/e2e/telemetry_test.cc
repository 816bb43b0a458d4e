// Callbacks in a real run: pipeline-level metrics, TensorBoard files, early stopping that ends the
// stage with its reason recorded, checkpoints on request.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "testing/pipelines.h"
#include "testing/subprocess.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

std::vector<nlohmann::json> JsonLines(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The stage metrics.jsonl of `steps` steps on the digits, run in `dir`.
std::vector<nlohmann::json> DigitsRunMetrics(const testing::TempDir& dir, int steps) {
  auto file = dir.Write(
      "p.pbtxt", "output_dir: \"out\"\n" +
                     testing::DigitsStage("s", "  schedule { max_steps: " + std::to_string(steps) +
                                                   " }\n"
                                                   "  callback { plugin: "
                                                   "\"metrics_jsonl\" }"));
  auto r = testing::RunEngine({"run", file.string()}, dir.path().string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return JsonLines(dir.path() / "out/s/metrics.jsonl");
}

TEST(TelemetryTest, CallbacksObserveAndSteerARun) {
  testing::TempDir dir;
  const std::string stage_callbacks = R"(
  precision { plugin: "fp32" }
  schedule { epochs: 20 eval_every_steps: 15 }
  callback { plugin: "tensorboard" }
  callback { plugin: "checkpoint_every" options { [type.googleapis.com/engine.plugins.CheckpointEveryOptions] { steps: 10 } } }
  callback {
    plugin: "early_stopping"
    options { [type.googleapis.com/engine.plugins.EarlyStoppingOptions] { metric: "eval/accuracy" patience: 1 min_delta: 0.5 } }
  }
  checkpoint { keep_last: 0 })";
  auto file = dir.Write(
      "p.pbtxt",
      "name: \"telemetry\"\noutput_dir: \"out\"\n"
      "callback { plugin: \"metrics_jsonl\" options { "
      "[type.googleapis.com/engine.plugins.MetricsJsonlOptions] { every_steps: 5 } } }\n" +
          testing::DigitsStage("s", stage_callbacks));
  auto r = testing::RunEngine({"run", file.string()}, dir.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  callbacks   metrics_jsonl (on error: disable)"));

  // early_stopping: two evaluations (steps 15, 30), the second cannot improve by 0.5.
  EXPECT_THAT(r.out, HasSubstr("stage 's': 30 steps in"));
  EXPECT_THAT(r.out, HasSubstr("(stopped early: eval/accuracy did not improve for 1 "
                               "evaluation(s) (best "));
  auto manifest = ReadManifest(dir.path() / "out/s/final");
  ASSERT_TRUE(manifest.ok());
  EXPECT_EQ(manifest->step(), 30u);
  EXPECT_EQ(manifest->total_steps(), 900u);
  EXPECT_THAT(manifest->stop_reason(), HasSubstr("eval/accuracy did not improve"));

  // checkpoint_every: steps 10 and 20 (30 is where the stage stopped: the final one).
  EXPECT_TRUE(
      std::filesystem::exists(dir.path() / "out/s/checkpoints/step-00000010/manifest.pbtxt"));
  EXPECT_TRUE(
      std::filesystem::exists(dir.path() / "out/s/checkpoints/step-00000020/manifest.pbtxt"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "out/s/checkpoints/step-00000030"));

  // metrics_jsonl at the pipeline level: the pipeline's begin and end around the stage's events.
  auto lines = JsonLines(dir.path() / "out/metrics.jsonl");
  ASSERT_GE(lines.size(), 6u);
  EXPECT_EQ(lines.front()["event"], "pipeline_begin");
  EXPECT_EQ(lines.back()["event"], "pipeline_end");
  EXPECT_EQ(lines.back()["message"], "finished");
  int steps = 0, evals = 0, checkpoints = 0;
  for (const auto& line : lines) {
    if (line["event"] == "step_end") {
      ++steps;
      EXPECT_EQ(line["step"].get<int>() % 5, 0);
      EXPECT_GT(line["rss_bytes"].get<int64_t>(), 0);
    }
    if (line["event"] == "eval") ++evals;
    if (line["event"] == "checkpoint_saved") ++checkpoints;
    if (line["event"] == "stage_end") {
      EXPECT_THAT(line["message"].get<std::string>(), HasSubstr("stopped early"));
    }
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(evals, 3) << "steps 15 and 30, and the final evaluation";
  EXPECT_EQ(checkpoints, 3);

  // tensorboard: one event file for the stage.
  int event_files = 0;
  for (const auto& item : std::filesystem::directory_iterator(dir.path() / "out/s/tensorboard")) {
    event_files += item.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_EQ(event_files, 1);
}

TEST(TelemetryTest, StageBeginCarriesThePlan) {
  testing::TempDir dir;
  const auto lines = DigitsRunMetrics(dir, 3);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.front()["event"], "stage_begin");
  const auto& plan = lines.front()["plan"];
  EXPECT_EQ(plan["name"], "s");
  EXPECT_EQ(plan["schedule"]["total_steps"], 3);
  EXPECT_EQ(plan["precision"]["requested"], "auto");
  EXPECT_FALSE(plan["census"].empty());
}

TEST(TelemetryTest, EachStepEndSaysWhereTheStepsTimeWent) {
  testing::TempDir dir;
  double previous_elapsed = 0;
  int steps = 0;
  for (const auto& line : DigitsRunMetrics(dir, 4)) {
    if (line["event"] != "step_end") continue;
    ++steps;
    const auto& m = line["metrics"];
    double phases = 0;
    for (const char* phase : {"batch", "forward", "backward", "host_read", "update"}) {
      const std::string name = std::string("seconds/") + phase;
      ASSERT_TRUE(m.contains(name)) << name << " in " << line.dump();
      EXPECT_GE(m[name].get<double>(), 0.0) << name;
      phases += m[name].get<double>();
    }
    EXPECT_GT(m["seconds/forward"].get<double>(), 0.0);
    EXPECT_GT(m["seconds/backward"].get<double>(), 0.0);
    EXPECT_GT(m["seconds/update"].get<double>(), 0.0);
    // This step's phases only: they fit in the time since the previous step ended.
    const double elapsed = line["elapsed_seconds"].get<double>();
    EXPECT_LE(phases, elapsed - previous_elapsed + 1e-6) << line.dump();
    previous_elapsed = elapsed;
  }
  EXPECT_EQ(steps, 4);
}

}  // namespace
}  // namespace engine
