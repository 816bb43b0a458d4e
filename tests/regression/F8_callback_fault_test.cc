// F8: a callback that fails must never kill the run or lose its checkpoint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

std::string CallbackFaultPipeline(const std::string& failure, const std::string& on_error) {
  return "output_dir: \"out\"\nplugin_path: \"" + std::string(testing::kTestPluginDir) +
         "/throwing_callback\"\nstage {\n  name: \"s\"\n  model { plugin: \"mlp\" }\n"
         "  data { plugin: \"digits\" options { [type.googleapis.com/engine.plugins."
         "DigitsOptions] { path: \"" +
         testing::DigitsDataPath().string() +
         "\" } } }\n  schedule { max_steps: 10 }\n  callback { plugin: \"throwing_callback\" "
         "options { [type.googleapis.com/engine.fixtures.ThrowingCallbackOptions] { failure: " +
         failure + " fail_at_step: 3 } }" + (on_error.empty() ? "" : " on_error: " + on_error) +
         " }\n}\n";
}

struct Outcome {
  testing::CommandResult result;
  std::string callback_log;
  bool checkpoint;
};

Outcome RunPipeline(const std::string& failure, const std::string& on_error) {
  testing::TempDir dir;
  dir.Write("p.pbtxt", CallbackFaultPipeline(failure, on_error));
  const std::string log = (dir.path() / "callback.log").string();
  Outcome o;
  o.result = testing::RunEngine({"run", "p.pbtxt"}, dir.path().string(),
                                {{"ENGINE_FIXTURE_CALLBACK_LOG", log}});
  o.callback_log = testing::ReadText(log);
  o.checkpoint = std::filesystem::exists(dir.path() / "out/s/final/manifest.pbtxt");
  return o;
}

TEST(F8CallbackFaultTest, ThrowingCallbackIsDisabledByDefaultAndTheRunFinishes) {
  for (const std::string failure : {"STD_EXCEPTION", "TORCH_ERROR", "STATUS"}) {
    Outcome o = RunPipeline(failure, "");
    EXPECT_EQ(o.result.exit_code, 0) << failure << "\n" << o.result.err;
    EXPECT_TRUE(o.checkpoint) << failure;
    EXPECT_THAT(o.result.err, HasSubstr("callback 'throwing_callback' on step_end at step 3: "))
        << failure;
    EXPECT_THAT(o.result.err, HasSubstr("on_error: DISABLE")) << failure;
    // Called up to the failing step, never after.
    EXPECT_THAT(o.callback_log, HasSubstr("step_end 3\n")) << failure;
    EXPECT_THAT(o.callback_log, ::testing::Not(HasSubstr("step_end 4"))) << failure;
  }
  EXPECT_THAT(RunPipeline("TORCH_ERROR", "").result.err, HasSubstr("the fixture's LibTorch error"));
}

TEST(F8CallbackFaultTest, WarnKeepsCallingAndFinishes) {
  Outcome o = RunPipeline("STD_EXCEPTION", "WARN");
  EXPECT_EQ(o.result.exit_code, 0) << o.result.err;
  EXPECT_TRUE(o.checkpoint);
  EXPECT_THAT(o.callback_log, HasSubstr("step_end 10\n"));
  EXPECT_THAT(o.callback_log, HasSubstr("stage_end"));
}

TEST(F8CallbackFaultTest, FailStageStopsWithTheCallbacksError) {
  Outcome o = RunPipeline("STD_EXCEPTION", "FAIL_STAGE");
  EXPECT_EQ(o.result.exit_code, 1);
  EXPECT_THAT(o.result.err,
              HasSubstr("engine run: stage 's': callback 'throwing_callback' on step_end at step "
                        "3: the fixture's std::runtime_error"));
  EXPECT_FALSE(o.checkpoint);
}

}  // namespace
}  // namespace engine
