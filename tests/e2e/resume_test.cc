// Resume: a stage stopped by SIGKILL or Ctrl-C goes on from its newest usable periodic
// checkpoint and ends with exactly the weights, optimizer state and loss scaler of a run that was
// never stopped, compared bit for bit on the CPU. A checkpoint whose write never finished, or whose
// files are damaged, is passed over.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>

#include "engine/safetensors.h"
#include "testing/pipelines.h"
#include "testing/same_file.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"

namespace engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class ResumeTest : public ::testing::Test {
 protected:
  // The uninterrupted run everything is compared with.
  void SetUp() override {
    const auto file = reference_.Write("p.pbtxt", testing::TwoStageDigitsPipeline());
    auto r = testing::RunEngine({"run", file.string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  void ExpectSameAsReference(const std::filesystem::path& out) {
    for (const char* stage : {"a", "b"}) {
      for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
        testing::ExpectSameSafetensors(reference_.path() / "out" / stage / "final" / file,
                                       out / stage / "final" / file);
      }
    }
  }

  testing::TempDir reference_;
};

TEST_F(ResumeTest, KilledMidStageResumesToTheSameWeightsBitForBit) {
  testing::TempDir tmp;
  const auto killed = tmp.Write(
      "killed.pbtxt", testing::TwoStageDigitsPipeline(testing::SignalAt("b", 28, "KILL")));
  auto r = testing::RunEngine({"run", killed.string()});
  ASSERT_EQ(r.exit_code, 128 + 9) << "SIGKILL at step 28 of b\n" << r.err;
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "out/b/final"));
  ASSERT_TRUE(std::filesystem::exists(tmp.path() / "out/b/checkpoints/step-00000025"));

  // The same pipeline without the killer: a is up to date, b goes on after step 25.
  const auto file = tmp.Write("p.pbtxt", testing::TwoStageDigitsPipeline());
  r = testing::RunEngine({"run", file.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': up to date"));
  EXPECT_THAT(r.out, HasSubstr("stage 'b': resuming after step 25 of 46 from "));
  EXPECT_THAT(r.out, HasSubstr("stage 'b': 46 steps in"));
  EXPECT_THAT(r.out, HasSubstr("(resumed after step 25)"));
  ExpectSameAsReference(tmp.path() / "out");

  // Finished: a third run trains nothing.
  r = testing::RunEngine({"run", file.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'b': up to date"));
  EXPECT_THAT(r.out, Not(HasSubstr("resuming")));
}

TEST_F(ResumeTest, CtrlCWritesACheckpointAndExits130ThenResumesBitForBit) {
  testing::TempDir tmp;
  const auto interrupted =
      tmp.Write("int.pbtxt", testing::TwoStageDigitsPipeline(testing::SignalAt("b", 28, "INT")));
  auto r = testing::RunEngine({"run", interrupted.string()});
  ASSERT_EQ(r.exit_code, 130) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("stage 'b': interrupted by SIGINT after step 28 of 46; checkpoint "));
  EXPECT_THAT(r.err, HasSubstr("step-00000028. Run the same command again to resume from it"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "out/b/final"));

  const auto file = tmp.Write("p.pbtxt", testing::TwoStageDigitsPipeline());
  r = testing::RunEngine({"run", file.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'b': resuming after step 28 of 46"));
  ExpectSameAsReference(tmp.path() / "out");
}

TEST_F(ResumeTest, SigtermStopsLikeCtrlC) {
  testing::TempDir tmp;
  const auto file =
      tmp.Write("p.pbtxt", testing::TwoStageDigitsPipeline(testing::SignalAt("a", 7, "TERM")));
  auto r = testing::RunEngine({"run", file.string()});
  ASSERT_EQ(r.exit_code, 130) << r.err;
  EXPECT_THAT(r.err, HasSubstr("stage 'a': interrupted by SIGTERM after step 7 of 23"));
  EXPECT_TRUE(
      std::filesystem::exists(tmp.path() / "out/a/checkpoints/step-00000007/manifest.pbtxt"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "out/b")) << "b never started";
}

TEST_F(ResumeTest, DamagedAndUnfinishedCheckpointsArePassedOver) {
  testing::TempDir tmp;
  const auto killed = tmp.Write(
      "killed.pbtxt", testing::TwoStageDigitsPipeline(testing::SignalAt("b", 28, "KILL")));
  ASSERT_EQ(testing::RunEngine({"run", killed.string()}).exit_code, 128 + 9);
  const auto checkpoints = tmp.path() / "out/b/checkpoints";
  // The newest checkpoint loses the end of its weights; a write that never finished sits beside.
  const auto newest = checkpoints / "step-00000025" / "model.safetensors";
  std::filesystem::resize_file(newest, std::filesystem::file_size(newest) - 100);
  std::filesystem::copy(checkpoints / "step-00000025", checkpoints / ".step-00000030.tmp-1-0",
                        std::filesystem::copy_options::recursive);

  const auto file = tmp.Write("p.pbtxt", testing::TwoStageDigitsPipeline());
  auto r = testing::RunEngine({"run", file.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step-00000025 is damaged ("));
  EXPECT_THAT(r.out, HasSubstr("stage 'b': resuming after step 20 of 46"));
  EXPECT_THAT(r.out, Not(HasSubstr("step-00000030")));
  ExpectSameAsReference(tmp.path() / "out");
  EXPECT_FALSE(std::filesystem::exists(checkpoints / ".step-00000030.tmp-1-0"))
      << "a new checkpoint write clears unfinished ones";
}

TEST_F(ResumeTest, ACheckpointOfAnotherConfigurationIsNotResumed) {
  testing::TempDir tmp;
  const auto killed = tmp.Write(
      "killed.pbtxt", testing::TwoStageDigitsPipeline(testing::SignalAt("b", 28, "KILL")));
  ASSERT_EQ(testing::RunEngine({"run", killed.string()}).exit_code, 128 + 9);
  // b changes: its checkpoints are of another configuration.
  const auto file = tmp.Write(
      "p.pbtxt", testing::TwoStageDigitsPipeline("", "", "  parallel { num_threads: 1 }"));
  auto r = testing::RunEngine({"run", file.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': up to date"));
  EXPECT_THAT(r.out, Not(HasSubstr("resuming")));
  EXPECT_THAT(r.out, HasSubstr("stage 'b': 46 steps in"));
  // Once b finished, the other configuration's checkpoints are gone; its own remain (keep_last 2).
  std::vector<std::string> left;
  for (const auto& item : std::filesystem::directory_iterator(tmp.path() / "out/b/checkpoints")) {
    left.push_back(item.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step-00000040", "step-00000045"}));
}

// Early stopping's patience spans an interruption: its best score and how long it has waited are
// in the checkpoint, so the resumed stage stops where the uninterrupted one stopped, with the same
// weights. Evaluations every 3 steps, patience 3: the reference stops at a step S after evaluations
// at S-6, S-3 and S without improvement; the interruption comes at S-2, with two of them counted.
// (S comes from the reference run, not from this machine's rounding.)
TEST(ResumeEarlyStoppingTest, EarlyStoppingCountsOnAcrossAResume) {
  auto pipeline = [](const std::string& header) {
    std::string text = testing::TwoStageDigitsPipeline(
        header, "",
        "  callback { plugin: \"early_stopping\" options { "
        "[type.googleapis.com/engine.plugins.EarlyStoppingOptions] { metric: \"eval/accuracy\" "
        "patience: 3 min_delta: 0.01 } } }\n");
    const std::string every = "checkpoint_every_steps: 5 ";
    text.insert(text.find(every) + every.size(), "eval_every_steps: 3 ");
    return text;
  };
  const std::regex stopped(
      "stage 'b': ([0-9]+) steps in [^(]*(\\(resumed after step [0-9]+\\) )?"
      "(\\(stopped early: [^)]*\\))");
  testing::TempDir reference;
  auto r = testing::RunEngine({"run", reference.Write("p.pbtxt", pipeline("")).string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(r.out, match, stopped)) << "no early stop:\n" << r.out;
  const int stop = std::stoi(match[1]);
  const std::string reason = match[3];
  ASSERT_GE(stop, 9);

  testing::TempDir tmp;
  r = testing::RunEngine(
      {"run", tmp.Write("int.pbtxt", pipeline(testing::SignalAt("b", stop - 2, "INT"))).string()});
  ASSERT_EQ(r.exit_code, 130) << r.err;
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08d", stop - 2);
  auto saved =
      safetensors::File::Open(tmp.path() / "out/b/checkpoints" / name / "optimizer.safetensors");
  ASSERT_TRUE(saved.ok()) << saved.status().message();
  EXPECT_THAT((*saved)->metadata(),
              ::testing::Contains(::testing::Pair("callback_state/0/0:early_stopping",
                                                  ::testing::MatchesRegex("0\\.[0-9]+ [0-9]+ 2"))));

  r = testing::RunEngine({"run", tmp.Write("p.pbtxt", pipeline("")).string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'b': resuming after step " + std::to_string(stop - 2)));
  ASSERT_TRUE(std::regex_search(r.out, match, stopped)) << r.out;
  EXPECT_EQ(std::stoi(match[1]), stop);
  EXPECT_EQ(match[3], reason);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    testing::ExpectSameSafetensors(reference.path() / "out/b/final" / file,
                                   tmp.path() / "out/b/final" / file);
  }
}

}  // namespace
}  // namespace engine
