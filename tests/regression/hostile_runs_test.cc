// A run is never lost or silently corrupted by what a hostile or careless user does: two runs on
// one output directory, text that is not UTF-8 in JSON output, numbers and flags at their limits,
// problems that used to show only after training, binary bytes in errors, --nproc on a bad file.
// (Checkpoint content hashes: stage_cache_test and stage_state_test; crashing plugin entry points:
// plugin_registry_test and below.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/output_dir_lock.h"
#include "testing/pipelines.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunEngine;

std::string HostilePipeline(const std::string& stage_extra, const std::string& header = "") {
  return "output_dir: \"out\"\n" + header + testing::DigitsStage("s", stage_extra);
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(HostileRunsTest, ASecondRunOnABusyOutputDirIsRefusedAtOnceNamingTheHolder) {
  testing::TempDir dir;
  auto file = dir.Write("p.pbtxt", HostilePipeline("  schedule { max_steps: 2 }"));
  auto held = OutputDirLock::Acquire(dir.path() / "out", "engine run first.pbtxt");
  ASSERT_TRUE(held.ok()) << held.status().message();
  auto r = RunEngine({"run", file.string()}, dir.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("the output directory '" + (dir.path() / "out").string() +
                               "' is in use by another run: pid " + std::to_string(::getpid()) +
                               " (engine run first.pbtxt)"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "out/s")) << "nothing may be written";
  held->reset();
  r = RunEngine({"run", file.string()}, dir.path().string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(HostileRunsTest, APluginWhoseManifestCrashesIsSkippedAndOtherPipelinesStillWork) {
  testing::TempDir dir;
  auto file = dir.Write("p.pbtxt", HostilePipeline("  schedule { max_steps: 2 }"));
  const std::string crashing = std::string(testing::kTestPluginDir) + "/crashing_manifest";
  auto r = RunEngine({"check", file.string(), "--plugin_path=" + crashing}, dir.path().string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = RunEngine({"plugins", "--plugin_path=" + crashing});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out + r.err, HasSubstr("engine_crashing_manifest.so"));
  EXPECT_THAT(r.out + r.err,
              HasSubstr("crashed (Segmentation fault) in its engine_plugin_manifest()"));
}

TEST(HostileRunsTest, JsonOutputReplacesBytesThatAreNotUtf8) {
  testing::TempDir dir;
  const std::string header =
      "name: \"caf\\351\"\n"
      "callback { plugin: \"metrics_jsonl\" }\n";
  auto file = dir.Write("p.pbtxt", HostilePipeline("  schedule { max_steps: 2 }", header));
  auto r = RunEngine({"check", file.string(), "--format=json"}, dir.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto plan = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(plan.is_discarded()) << r.out;
  EXPECT_EQ(plan["plan"]["pipeline"], "caf\xef\xbf\xbd");

  r = RunEngine({"run", file.string()}, dir.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(dir.path() / "out/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    EXPECT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded()) << line;
  }
  EXPECT_GE(lines, 4);
}

TEST(HostileRunsTest, NumbersAndFlagsAtTheirLimits) {
  testing::TempDir dir;
  auto huge =
      dir.Write("huge.pbtxt", HostilePipeline("  schedule { max_steps: 9223372036854775808 }"));
  auto r = RunEngine({"check", huge.string()}, dir.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("schedule.max_steps must be at most 1000000000000 (got "
                               "9223372036854775808)"));
  EXPECT_THAT(r.err, Not(HasSubstr("warmup_steps")));

  auto good = dir.Write("good.pbtxt", HostilePipeline("  schedule { max_steps: 2 }"));
  r = RunEngine({"run", good.string(), "--output_dir="}, dir.path().string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("engine run: --output_dir needs a directory"));

  auto big = dir.Write("big.pbtxt", HostilePipeline("  schedule { epochs: 1 batch_size: 100000 "
                                                    "gradient_accumulation_steps: 7 }"));
  r = RunEngine({"check", big.string()}, dir.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("warning: schedule.batch_size 100000 is larger than the "));
  EXPECT_THAT(r.out, HasSubstr("warning: schedule.gradient_accumulation_steps 7 is more than the 1 "
                               "batches of an epoch: a step accumulates at most 1"));
  EXPECT_THAT(r.out, Not(HasSubstr("= 700000 examples per step")));
}

TEST(HostileRunsTest, ProblemsThatUsedToShowAfterTrainingAreFoundByCheck) {
  testing::TempDir dir;
  dir.Write("out/s", "a file where the stage's directory belongs");
  auto file = dir.Write("p.pbtxt", HostilePipeline("  schedule { max_steps: 2 }"));
  auto r = RunEngine({"check", file.string()}, dir.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("stage 's': its output directory '" +
                               (dir.path() / "out/s").string() + "' is not a directory"));

  auto stopping = dir.Write(
      "stop.pbtxt",
      "output_dir: \"out2\"\n" +
          testing::DigitsStage("s",
                               "  schedule { max_steps: 20 eval_every_steps: 10 }\n"
                               "  callback { plugin: \"early_stopping\" options { "
                               "[type.googleapis.com/engine.plugins.EarlyStoppingOptions] { "
                               "metric: \"accuracy\" } } }"));
  r = RunEngine({"check", stopping.string()}, dir.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("'accuracy' is never reported by an evaluation"));

  auto unreported = dir.Write(
      "bleu.pbtxt",
      "output_dir: \"out3\"\n" +
          testing::DigitsStage("s",
                               "  schedule { max_steps: 20 eval_every_steps: 10 }\n"
                               "  callback { plugin: \"early_stopping\" options { "
                               "[type.googleapis.com/engine.plugins.EarlyStoppingOptions] { "
                               "metric: \"eval/bleu\" } } }"));
  r = RunEngine({"check", unreported.string()}, dir.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("callback 'early_stopping': watches 'eval/bleu', which stage 's''s "
                               "evaluation does not report (it reports eval/accuracy, eval/loss)"));
  r = RunEngine({"run", unreported.string()}, dir.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "out3")) << "refused before step 0";
}

TEST(HostileRunsTest, BinaryBytesInADataErrorArePrintedEscaped) {
  testing::TempDir dir;
  std::string csv;
  for (int i = 0; i < 64; ++i) csv += "0,";
  csv += "\x1b[2J\xff\x01\n";
  dir.Write("bad.csv", csv);
  auto file = dir.Write(
      "p.pbtxt",
      "output_dir: \"out\"\nstage {\n  name: \"s\"\n  model { plugin: \"mlp\" }\n"
      "  data { plugin: \"digits\" options { [type.googleapis.com/engine.plugins.DigitsOptions] "
      "{ path: \"bad.csv\" } } }\n}\n");
  auto r = RunEngine({"check", file.string()}, dir.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("is '\\x1b[2J\\xff\\x01'"));
  EXPECT_THAT(r.err, Not(HasSubstr("\x1b")));
}

TEST(HostileRunsTest, NprocOnAnInvalidPipelineChecksOnceAndStartsNoRank) {
  testing::TempDir dir;
  auto file = dir.Write("p.pbtxt", HostilePipeline("  schedule { batch_size: 0 }"));
  auto r = RunEngine({"run", file.string(), "--nproc=1000"}, dir.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(Count(r.err, "schedule.batch_size must be > 0"), 1u) << r.err;
  EXPECT_THAT(r.err, HasSubstr("nothing was run"));
  EXPECT_THAT(r.err, Not(HasSubstr("rank")));

  // An error found only when the data is opened, too.
  auto missing = dir.Write(
      "missing.pbtxt",
      "output_dir: \"out\"\nstage {\n  name: \"s\"\n  model { plugin: \"mlp\" }\n"
      "  data { plugin: \"digits\" options { [type.googleapis.com/engine.plugins.DigitsOptions] "
      "{ path: \"no-such.csv\" } } }\n  parallel { strategy: DDP }\n}\n");
  r = RunEngine({"run", missing.string(), "--nproc=1000"}, dir.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(Count(r.err, "no-such.csv"), 1u) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("rank")));
}

// A valid pipeline whose stage does not ask for DDP started ranks until memory ran out; so did a
// CPU DDP stage with far more ranks than cores. Both are refused before any rank starts.
TEST(HostileRunsTest, NprocBeyondWhatThePipelineAndTheMachineAllowStartsNoRank) {
  testing::TempDir dir;
  auto plain =
      dir.Write("plain.pbtxt", HostilePipeline("  schedule { max_steps: 2 batch_size: 16 }"));
  auto r = RunEngine({"run", plain.string(), "--nproc=1000"}, dir.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("it would run as rank 999 of WORLD_SIZE=1000, but the stage does "
                               "not ask for parallel { strategy: DDP }"));
  EXPECT_THAT(r.err, Not(HasSubstr("started")));

  auto ddp =
      dir.Write("ddp.pbtxt", HostilePipeline("  schedule { max_steps: 2 batch_size: 16 }\n"
                                             "  parallel { device: \"cpu\" strategy: DDP }"));
  r = RunEngine({"run", ddp.string(), "--nproc=1000"}, dir.path().string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--nproc=1000 starts more ranks than the "));
  EXPECT_THAT(r.err, HasSubstr("add --oversubscribe to share the cores among them"));
  EXPECT_THAT(r.err, Not(HasSubstr("started")));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "out"));

  r = RunEngine({"run", ddp.string(), "--oversubscribe"}, dir.path().string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--oversubscribe goes with --nproc=N"));
}

}  // namespace
}  // namespace engine
