// `engine eval`: a trained stage evaluated from its checkpoint without training gives the metrics
// the run reported; missing, foreign and damaged checkpoints are refused by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "testing/pipelines.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "train/checkpoint.h"

namespace engine {
namespace {

using ::testing::HasSubstr;
using testing::RunEngine;

class EvalCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    pipeline_ = new std::string(dir_->Write("p.pbtxt", testing::TwoStageDigitsPipeline()).string());
    auto run = RunEngine({"run", *pipeline_});
    ASSERT_EQ(run.exit_code, 0) << run.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete pipeline_;
  }
  static std::filesystem::path Out() { return dir_->path() / "out"; }

  static testing::TempDir* dir_;
  static std::string* pipeline_;
};
testing::TempDir* EvalCliTest::dir_ = nullptr;
std::string* EvalCliTest::pipeline_ = nullptr;

TEST_F(EvalCliTest, TheLastStagesMetricsEqualWhatTheRunReported) {
  auto r = RunEngine({"eval", *pipeline_, "--format=json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["stage"], "b");
  EXPECT_EQ(json["eval_examples"], 359);
  auto manifest = ReadManifest(Out() / "b" / "final");
  ASSERT_TRUE(manifest.ok()) << manifest.status().message();
  ASSERT_FALSE(manifest->metrics().empty());
  for (const auto& [name, value] : manifest->metrics()) {
    EXPECT_NEAR(json["metrics"][name].get<double>(), value, 1e-9) << name;
  }
  EXPECT_TRUE(json["baselines"].is_object());

  auto text = RunEngine({"eval", *pipeline_, "--stage=a"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("stage 'a': eval of 359 examples in "));
  EXPECT_THAT(text.out, ::testing::ContainsRegex("accuracy 0\\.[0-9]{4} loss [0-9.]+;"));
  EXPECT_THAT(text.out, HasSubstr("checkpoint " + (Out() / "a" / "final").string()));
}

TEST_F(EvalCliTest, WrongStagesAndCheckpointsAreRefusedByName) {
  auto stage = RunEngine({"eval", *pipeline_, "--stage=c"});
  EXPECT_EQ(stage.exit_code, 1);
  EXPECT_THAT(stage.err, HasSubstr("the pipeline has no stage 'c' (its stages: 'a', 'b')"));

  auto foreign = RunEngine(
      {"eval", *pipeline_, "--stage=b", "--checkpoint=" + (Out() / "a" / "final").string()});
  EXPECT_EQ(foreign.exit_code, 1);
  EXPECT_THAT(foreign.err, HasSubstr("is a checkpoint of stage 'a', not of 'b'"));

  testing::TempDir empty;
  auto missing = RunEngine({"eval", *pipeline_, "--output_dir=" + empty.path().string()});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("stage 'b': no checkpoint at '"));
  EXPECT_THAT(missing.err, HasSubstr("train the stage with `engine run`"));

  EXPECT_EQ(RunEngine({"eval", *pipeline_, "--format=xml"}).exit_code, 2);
  EXPECT_EQ(RunEngine({"eval"}).exit_code, 2);
}

TEST_F(EvalCliTest, ADamagedCheckpointIsRefused) {
  // Bytes changed in place, same size: only the content hash can tell.
  testing::TempDir copy;
  std::filesystem::copy(Out() / "a" / "final", copy.path() / "final");
  const auto weights = copy.path() / "final" / kModelFile;
  {
    std::fstream file(weights, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-16, std::ios::end);
    file.write("\x7f\x7f\x7f\x7f", 4);
  }
  auto r = RunEngine(
      {"eval", *pipeline_, "--stage=a", "--checkpoint=" + (copy.path() / "final").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(kModelFile));
}

}  // namespace
}  // namespace engine
