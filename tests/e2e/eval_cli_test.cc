// `engine eval`: a trained stage evaluated from its checkpoint without training gives the metrics
// the run reported; missing, foreign and damaged checkpoints are refused by name; `--logits` writes
// the model's logits with the inputs that gave them (tests/e2e/export_interop_test.cc runs
// transformers on them).
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/safetensors.h"
#include "testing/pipelines.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"

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

TEST_F(EvalCliTest, LogitsAreRefusedForAModelThatHasNone) {
  const auto file = dir_->path() / "mlp_logits.safetensors";
  auto r = RunEngine({"eval", *pipeline_, "--logits=" + file.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("the model 'mlp' does not report its logits"));
  EXPECT_FALSE(std::filesystem::exists(file));

  auto lone = RunEngine({"eval", *pipeline_, "--examples=2"});
  EXPECT_EQ(lone.exit_code, 2);
  EXPECT_THAT(lone.err, HasSubstr("--examples goes with --logits"));
  auto directory = RunEngine({"eval", *pipeline_, "--logits=" + dir_->path().string()});
  EXPECT_EQ(directory.exit_code, 2);
  EXPECT_THAT(directory.err, HasSubstr("is a directory; name the file to write"));
  auto nowhere =
      RunEngine({"eval", *pipeline_, "--logits=" + (dir_->path() / "no/such.st").string()});
  EXPECT_EQ(nowhere.exit_code, 2);
  EXPECT_THAT(nowhere.err, HasSubstr("does not exist"));
  auto zero = RunEngine({"eval", *pipeline_, "--logits=" + file.string(), "--examples=0"});
  EXPECT_EQ(zero.exit_code, 2);
  auto empty = RunEngine({"eval", *pipeline_, "--logits="});
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_THAT(empty.err, HasSubstr("--logits is empty"));
  auto split_alone = RunEngine({"eval", *pipeline_, "--split=train"});
  EXPECT_EQ(split_alone.exit_code, 2);
  EXPECT_THAT(split_alone.err, HasSubstr("--split goes with --logits"));
  auto bad_split = RunEngine({"eval", *pipeline_, "--logits=" + file.string(), "--split=test"});
  EXPECT_EQ(bad_split.exit_code, 2);
  EXPECT_THAT(bad_split.err, HasSubstr("--split must be train or eval, not 'test'"));
}

// A chat stage with three of its six conversations held out (so an eval batch has rows of unequal
// length), trained for `steps` steps in `dir`; the pipeline file.
std::string TrainedChatPipeline(const testing::TempDir& dir, int steps) {
  const std::string stage = testing::ChatLlamaStage(
      "sft",
      "precision { plugin: \"fp32\" }\nschedule { max_steps: " + std::to_string(steps) +
          " batch_size: 2 }",
      "0.5");
  const std::string pipeline =
      dir.Write("chat.pbtxt", "name: \"chat\"\noutput_dir: \"out\"\n" + stage).string();
  EXPECT_EQ(RunEngine({"run", pipeline}).exit_code, 0);
  return pipeline;
}

// The file's logits are the ones the evaluation scores: their next-token cross-entropy over the
// labels of the whole eval split is the loss `engine eval` reports (f32 sums in another order:
// 1e-5).
TEST(EvalLogitsTest, TheFilesLogitsGiveTheEvaluationsLossOnTheSameExamples) {
  testing::TempDir dir;
  const std::string pipeline = TrainedChatPipeline(dir, 2);
  auto eval = RunEngine({"eval", pipeline, "--format=json"});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const auto metrics = nlohmann::json::parse(eval.out);
  const int64_t examples = metrics["eval_examples"].get<int64_t>();
  ASSERT_GE(examples, 2);

  const auto file = dir.path() / "logits.safetensors";
  auto r = RunEngine({"eval", pipeline, "--logits=" + file.string(),
                      "--examples=" + std::to_string(examples), "--format=json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto said = nlohmann::json::parse(r.out);
  EXPECT_EQ(said["stage"], "sft");
  EXPECT_EQ(said["examples"], examples);
  auto opened = safetensors::File::Open(file);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  const safetensors::File& saved = **opened;
  EXPECT_EQ(saved.metadata().at("stage"), "sft");
  EXPECT_EQ(saved.metadata().at("architecture"), "llama");
  std::map<std::string, at::Tensor> t;
  for (const char* name : {"input_ids", "attention_mask", "labels", "position_ids", "logits"}) {
    auto tensor = saved.Get(name);
    ASSERT_TRUE(tensor.ok()) << name << ": " << tensor.status().message();
    t[name] = *tensor;
  }
  const int64_t length = t["input_ids"].size(1);
  EXPECT_EQ(t["input_ids"].sizes(), (std::vector<int64_t>{examples, length}));
  EXPECT_EQ(t["position_ids"].sizes(), (std::vector<int64_t>{examples, length}));
  EXPECT_EQ(t["logits"].scalar_type(), at::kFloat);
  EXPECT_EQ(t["logits"].size(0), examples);
  EXPECT_EQ(t["logits"].size(1), length);
  EXPECT_EQ(std::vector<int64_t>(said["shape"]), t["logits"].sizes().vec());
  // Rows of unequal length: padding is where the positions stop counting.
  const at::Tensor mask = t["attention_mask"].to(at::kBool);
  EXPECT_FALSE(mask.all().item<bool>());
  EXPECT_TRUE(t["position_ids"].masked_select(mask).equal(
      (t["attention_mask"].cumsum(1) - 1).masked_select(mask)));

  const at::Tensor targets =
      t["labels"].slice(1, 1).masked_fill(~mask.slice(1, 1), -100).reshape({-1});
  const at::Tensor scores = t["logits"].slice(1, 0, length - 1).reshape({-1, t["logits"].size(2)});
  const double loss =
      at::cross_entropy_loss(scores, targets, {}, at::Reduction::Mean, -100).item<double>();
  EXPECT_NEAR(loss, metrics["metrics"]["eval/loss"].get<double>(), 1e-5) << metrics.dump();
}

// --split=train: the training split's examples, the ones `engine preview` shows, in its order.
TEST(EvalLogitsTest, TheTrainingSplitsLogitsAreOnTheExamplesPreviewShows) {
  testing::TempDir dir;
  const std::string pipeline = TrainedChatPipeline(dir, 1);
  const auto file = dir.path() / "train_logits.safetensors";
  auto r =
      RunEngine({"eval", pipeline, "--logits=" + file.string(), "--split=train", "--examples=2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("logits of 2 train examples"));
  auto preview = RunEngine({"preview", pipeline, "-n", "2", "--format=json"});
  ASSERT_EQ(preview.exit_code, 0) << preview.err;
  const auto shown = nlohmann::json::parse(preview.out)["examples"];
  ASSERT_EQ(shown.size(), 2u);

  auto opened = safetensors::File::Open(file);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  EXPECT_EQ((*opened)->metadata().at("split"), "train");
  auto ids = (*opened)->Get("input_ids");
  auto mask = (*opened)->Get("attention_mask");
  ASSERT_TRUE(ids.ok() && mask.ok());
  ASSERT_EQ(ids->size(0), 2);
  for (int64_t row = 0; row < 2; ++row) {
    const at::Tensor kept = (*ids)[row].masked_select((*mask)[row].to(at::kBool));
    const std::vector<int64_t> got(kept.data_ptr<int64_t>(),
                                   kept.data_ptr<int64_t>() + kept.numel());
    EXPECT_EQ(got, shown[row]["input_ids"].get<std::vector<int64_t>>()) << "row " << row;
  }
}

}  // namespace
}  // namespace engine
