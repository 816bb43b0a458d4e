// The training loop on the real digits data: determinism, accumulation, checkpoints and events.
#include "train/trainer.h"

#include <ATen/Context.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/record_function.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "pipeline/pipeline_loader.h"
#include "run/pipeline_runner.h"
#include "testing/pipelines.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"
#include "train/step_scalars.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(registry_.LoadDirectory(testing::kBuiltinPluginDir).ok()); }

  std::string Stage(const std::string& name, const std::string& extra) {
    return testing::DigitsStage(name, testing::Precision("fp32") + extra, "hidden_units: 32");
  }

  // Plans and runs `text` into out/<tag>; returns the final weights of `stage`.
  safetensors::NamedTensors Run(const std::string& tag, const std::string& text,
                                const std::string& stage, Status* status = nullptr) {
    Diagnostics diagnostics;
    auto file = dir_.Write(tag + ".pbtxt", "output_dir: \"out/" + tag + "\"\n" + text);
    pipelines_.push_back(LoadPipeline(file, {}, &registry_, &diagnostics));
    EXPECT_NE(pipelines_.back(), nullptr) << diagnostics.ToString();
    if (pipelines_.back() == nullptr) return {};
    auto plan = BuildPlan(*pipelines_.back(), &diagnostics);
    EXPECT_NE(plan, nullptr) << diagnostics.ToString();
    if (plan == nullptr) return {};
    std::ostringstream out;
    Status s = RunPipeline(plan.get(), {}, out, &outcomes_);
    if (status != nullptr) {
      *status = s;
    } else {
      EXPECT_TRUE(s.ok()) << s.message();
    }
    auto weights =
        safetensors::File::Open(dir_.path() / "out" / tag / stage / "final" / kModelFile);
    if (!weights.ok()) return {};
    return *(*weights)->GetAll();
  }

  // Defined with the host-read tests below.
  void ExpectFourStepsThatReadOnce(const std::string& model, const std::string& device);

  testing::TempDir dir_;
  PluginRegistry registry_;
  std::vector<std::unique_ptr<ResolvedPipeline>> pipelines_;
  std::vector<StageOutcome> outcomes_;
};

void ExpectSameWeights(const safetensors::NamedTensors& a, const safetensors::NamedTensors& b,
                       bool bitwise, double atol = 0) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    if (bitwise) {
      EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
    } else {
      EXPECT_TRUE(at::allclose(a[i].second, b[i].second, 1e-4, atol)) << a[i].first;
    }
  }
}

TEST_F(TrainerTest, SameSeedSameWeightsBitForBit) {
  auto a = Run("a", Stage("s", "schedule { epochs: 2 }"), "s");
  auto b = Run("b", Stage("s", "schedule { epochs: 2 }"), "s");
  ExpectSameWeights(a, b, /*bitwise=*/true);
  auto c = Run("c", "seed: 1\n" + Stage("s", "schedule { epochs: 2 }"), "s");
  EXPECT_FALSE(at::equal(a[0].second, c[0].second)) << "another seed trains differently";
}

TEST_F(TrainerTest, AccumulationEqualsTheLargerBatch) {
  // 1,438 examples: 23 steps of 64 either way, the last one of 30 examples.
  auto big = Run("big",
                 Stage("s",
                       "schedule { epochs: 1 batch_size: 64 } "
                       "optimizer { sgd { momentum: 0.9 } learning_rate: 0.1 }"),
                 "s");
  auto accumulated = Run("acc",
                         Stage("s",
                               "schedule { epochs: 1 batch_size: 32 "
                               "gradient_accumulation_steps: 2 } "
                               "optimizer { sgd { momentum: 0.9 } learning_rate: 0.1 }"),
                         "s");
  ASSERT_EQ(outcomes_[0].result.steps, 23);
  ASSERT_EQ(outcomes_[1].result.steps, 23);
  ExpectSameWeights(big, accumulated, /*bitwise=*/false, 1e-5);
}

TEST_F(TrainerTest, LearnsTheDigits) {
  Run("learn", Stage("s", "schedule { epochs: 10 } optimizer { learning_rate: 0.003 }"), "s");
  ASSERT_EQ(outcomes_.size(), 1u);
  const StageResult& r = outcomes_[0].result;
  EXPECT_EQ(r.steps, 450);
  EXPECT_EQ(r.eval_examples, 359);
  EXPECT_GT(r.eval_metrics.at("eval/accuracy"), 0.9);
  EXPECT_LT(r.eval_metrics.at("eval/loss"), 0.4);
  auto manifest = ReadManifest(r.final_checkpoint);
  ASSERT_TRUE(manifest.ok());
  EXPECT_TRUE(manifest->final());
  EXPECT_EQ(manifest->step(), 450u);
  EXPECT_DOUBLE_EQ(manifest->metrics().at("eval/accuracy"), r.eval_metrics.at("eval/accuracy"));
}

TEST_F(TrainerTest, StepPhasesAccountForTheTrainingTime) {
  Run("phases", Stage("s", "schedule { epochs: 1 }"), "s");
  ASSERT_EQ(outcomes_.size(), 1u);
  const StageResult& r = outcomes_[0].result;
  const StepPhaseSeconds& p = r.step_phases;
  for (double phase : {p.batch, p.forward, p.backward, p.host_read, p.update}) {
    EXPECT_GT(phase, 0.0);
  }
  EXPECT_EQ(p.callbacks, 0.0) << "no callbacks, no step_end event to time";
  EXPECT_LE(p.batch + p.forward + p.backward + p.host_read + p.update, r.train_seconds);
}

// The host reads seen by LibTorch's profiler callbacks, in order: each step's scalars
// (kReadStepScalarsScope), every item() and every copy from a device to the host (a
// synchronisation with the device each), except the copy inside the step's read itself.
class HostReadRecorder {
 public:
  HostReadRecorder()
      : handle_(at::addGlobalCallback(at::RecordFunctionCallback(&Start, &End).needsInputs(true))) {
    Reads().clear();
  }
  ~HostReadRecorder() { at::removeCallback(handle_); }
  static std::vector<std::string>& Reads() {
    static std::vector<std::string> reads;
    return reads;
  }

 private:
  static int& InStepRead() {
    thread_local int depth = 0;
    return depth;
  }
  static void Add(const std::string& read) {
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    Reads().push_back(read);
  }
  static bool CopiesToTheHost(const at::RecordFunction& fn) {
    const auto inputs = fn.inputs();
    return inputs.size() >= 2 && inputs[0].isTensor() && inputs[1].isTensor() &&
           inputs[0].toTensor().is_cpu() && !inputs[1].toTensor().is_cpu();
  }
  static std::unique_ptr<at::ObserverContext> Start(const at::RecordFunction& fn) {
    const std::string name = fn.name();
    if (name == kReadStepScalarsScope) {
      Add(name);
      ++InStepRead();
    } else if (InStepRead() == 0 && name == "aten::_local_scalar_dense") {
      Add(name);
    } else if (InStepRead() == 0 && name == "aten::copy_" && CopiesToTheHost(fn)) {
      Add("device to host copy");
    }
    return nullptr;
  }
  static void End(const at::RecordFunction& fn, at::ObserverContext*) {
    if (fn.name() == std::string(kReadStepScalarsScope)) --InStepRead();
  }
  at::CallbackHandle handle_;
};

// What happened between the first and the last step's read: none of them is a read of its own.
int64_t ReadsBetweenTheSteps(const std::vector<std::string>& reads) {
  const auto first = std::find(reads.begin(), reads.end(), kReadStepScalarsScope);
  const auto last = std::find(reads.rbegin(), reads.rend(), kReadStepScalarsScope);
  if (first == reads.end()) return -1;
  return std::distance(first, last.base()) -
         std::count(first, last.base(), std::string(kReadStepScalarsScope));
}

TEST_F(TrainerTest, EachStepReadsItsScalarsFromTheDeviceInOneCopy) {
  // bf16 gradients handed to f32 masters, clipping and accumulation: every part of the step that
  // reads a number (loss, non-finite flags, gradient norm) reads it in the one copy.
  std::vector<std::string> reads;
  {
    HostReadRecorder recorder;
    Run("reads",
        testing::DigitsStage("s",
                             testing::Precision("bf16-mixed") +
                                 "schedule { max_steps: 6 gradient_accumulation_steps: 2 } "
                                 "optimizer { max_grad_norm: 0.5 }",
                             "hidden_units: 32"),
        "s");
    reads = HostReadRecorder::Reads();
  }
  ASSERT_EQ(outcomes_.size(), 1u);
  EXPECT_EQ(std::count(reads.begin(), reads.end(), kReadStepScalarsScope), 6);
  // Steps 2 to 6 lie between the first step's read and the last one's.
  EXPECT_EQ(ReadsBetweenTheSteps(reads), 0);
}

TEST_F(TrainerTest, AccumulatingMicroBatchesOfUnequalTokenCountsEqualsTheLargerBatch) {
  // The count of each micro-batch stays on the device until the step's read; the gradients are
  // divided by the step's total after it. 4 training conversations: one step per epoch.
  const std::string optimizer = "optimizer { sgd { momentum: 0.9 } learning_rate: 0.1 } ";
  auto big = Run("big",
                 testing::ChatLlamaStage("s", testing::Precision("fp32") + optimizer +
                                                  "schedule { epochs: 2 batch_size: 4 }"),
                 "s");
  auto accumulated = Run("acc",
                         testing::ChatLlamaStage("s", testing::Precision("fp32") + optimizer +
                                                          "schedule { epochs: 2 batch_size: 2 "
                                                          "gradient_accumulation_steps: 2 }"),
                         "s");
  ASSERT_EQ(outcomes_.size(), 2u);
  ASSERT_EQ(outcomes_[0].result.steps, 2);
  ASSERT_EQ(outcomes_[1].result.steps, 2);
  ExpectSameWeights(big, accumulated, /*bitwise=*/false, 1e-6);
  EXPECT_NEAR(outcomes_[1].result.final_train_loss, outcomes_[0].result.final_train_loss, 1e-5);
}

// A small Qwen2-VL (pipelines/qwen2_vl_tiny) on the digit chat: each conversation an image of a
// digit and its name. `extra` goes inside the stage.
std::string Qwen2VlChatStage(const std::string& extra) {
  const std::string source = testing::kSourceDir, data = testing::kDataDir;
  return "stage { name: \"s\"\n model { plugin: \"qwen2_vl\" options { "
         "[type.googleapis.com/engine.transformer.Qwen2VlOptions] { config: \"" +
         source +
         "/pipelines/qwen2_vl_tiny/config.json\" } } }\n"
         " data { plugin: \"chat\" options { [type.googleapis.com/engine.plugins.ChatOptions] { "
         "path: \"" +
         data + "/digit_chat/digits.jsonl\" max_length: 64 eval_fraction: 0.01 " +
         "tokenizer { kind: HF_JSON path: \"" + source +
         "/tests/fixtures/tokenizers/qwen2_vl_bpe.json\" config: \"" + source +
         "/pipelines/qwen2_vl_tiny/tokenizer_config.json\" } images { processor: \"" + source +
         "/pipelines/qwen2_vl_tiny/preprocessor_config.json\" } } } }\n" + extra + "\n}\n";
}

// Trains 4 steps of `model` ("llama": a small Llama on the chat fixture; "qwen2_vl": a
// small Qwen2-VL on the digit chat, its images included) with its decoder in 4 bits and LoRA, in
// bf16-mixed, with clipping and accumulation, on `device`: counts of loss terms, rotary tables,
// multimodal positions and masks read nothing; the step's one copy reads the counts with the loss.
// Expects exactly that: 4 step reads, nothing read or copied to the host between them.
void TrainerTest::ExpectFourStepsThatReadOnce(const std::string& model, const std::string& device) {
  const std::string extra =
      testing::Precision("bf16-mixed") +
      "quantizer { plugin: \"nf4\" options { [type.googleapis.com/engine.plugins.Nf4Options] { "
      "target_modules: \"model.layers.*\" } } }\n"
      "adapter { plugin: \"lora\" options { [type.googleapis.com/engine.plugins.LoraOptions] { "
      "r: 4 target_modules: \"model.layers.*\" } } }\n"
      "trainable { include: \"*.lora_A.*\" include: \"*.lora_B.*\" }\n"
      "schedule { max_steps: 4 batch_size: 2 gradient_accumulation_steps: 2 } "
      "optimizer { max_grad_norm: 0.5 } parallel { device: \"" +
      device + "\" }";
  std::vector<std::string> reads;
  {
    HostReadRecorder recorder;
    Run(model + "_reads_" + device,
        model == "llama" ? testing::ChatLlamaStage("s", extra) : Qwen2VlChatStage(extra), "s");
    reads = HostReadRecorder::Reads();
  }
  ASSERT_EQ(outcomes_.size(), 1u);
  EXPECT_EQ(std::count(reads.begin(), reads.end(), kReadStepScalarsScope), 4);
  EXPECT_EQ(ReadsBetweenTheSteps(reads), 0) << ::testing::PrintToString(reads);
}

// On the CPU every item() is seen (the reads that would wait for a GPU), but a copy to the host
// cannot be told from a GPU's: the tests on a GPU see those too.
TEST_F(TrainerTest, ACausalLmStepReadsTheDeviceOnce) {
  ExpectFourStepsThatReadOnce("llama", "cpu");
}

TEST_F(TrainerTest, AQwen2VlStepReadsTheDeviceOnce) {
  ExpectFourStepsThatReadOnce("qwen2_vl", "cpu");
}

TEST_F(TrainerTest, ACausalLmStepOnAGpuReadsAndCopiesToTheHostOnce) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  ExpectFourStepsThatReadOnce("llama", "cuda");
}

TEST_F(TrainerTest, AQwen2VlStepOnAGpuReadsAndCopiesToTheHostOnce) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  ExpectFourStepsThatReadOnce("qwen2_vl", "cuda");
}

TEST_F(TrainerTest, PeriodicCheckpointsAreKeptAsConfigured) {
  Run("periodic",
      Stage("s",
            "schedule { max_steps: 50 checkpoint_every_steps: 10 } "
            "checkpoint { keep_last: 2 }"),
      "s");
  const auto dir = dir_.path() / "out" / "periodic" / "s";
  std::vector<std::string> names;
  for (const auto& item : std::filesystem::directory_iterator(dir / "checkpoints")) {
    names.push_back(item.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000030", "step-00000040"}));
  EXPECT_EQ(ReadManifest(dir / "checkpoints" / "step-00000040")->step(), 40u);
  EXPECT_FALSE(ReadManifest(dir / "checkpoints" / "step-00000040")->final());
  EXPECT_EQ(ReadManifest(dir / "final")->step(), 50u);

  // A second training, of another configuration, keeps its own newest one; once it finishes, the
  // first training's checkpoints (which nothing can resume from any more) are removed.
  Run("periodic",
      Stage("s",
            "schedule { max_steps: 25 checkpoint_every_steps: 10 } "
            "checkpoint { keep_last: 1 }"),
      "s");
  names.clear();
  for (const auto& item : std::filesystem::directory_iterator(dir / "checkpoints")) {
    names.push_back(item.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000020"}));
  EXPECT_EQ(ReadManifest(dir / "final")->step(), 25u);
}

TEST_F(TrainerTest, FromStageStartsFromTheParentsFinalWeights) {
  const std::string text = Stage("first", "schedule { max_steps: 30 }") +
                           Stage("second",
                                 "from_stage: \"first\" schedule { max_steps: 1 } "
                                 "optimizer { sgd {} learning_rate: 1e-9 }");
  auto second = Run("handoff", text, "second");
  auto first =
      *(*safetensors::File::Open(dir_.path() / "out/handoff/first/final" / kModelFile))->GetAll();
  // One step at a vanishing learning rate: the second stage ends where the first did.
  ExpectSameWeights(first, second, /*bitwise=*/false, 1e-6);
  auto manifest = ReadManifest(dir_.path() / "out/handoff/second/final");
  EXPECT_THAT(manifest->parent_checkpoint(), HasSubstr("handoff/first/final"));
}

TEST_F(TrainerTest, NonFiniteLossStopsTheStageWithoutAFinalCheckpoint) {
  Status status;
  Run("diverge", Stage("s", "optimizer { sgd {} learning_rate: 1e30 }"), "s", &status);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("stage 's': the training loss became"));
  EXPECT_THAT(status.message(), HasSubstr("Lower optimizer.learning_rate"));
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "out/diverge/s/final"));
}

TEST(EpochOrderTest, APermutationFixedBySeedAndEpoch) {
  auto a = EpochOrder(7, 0, 100);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_EQ(a, EpochOrder(7, 0, 100));
  EXPECT_NE(a, EpochOrder(7, 1, 100));
  EXPECT_NE(a, EpochOrder(8, 0, 100));
}

}  // namespace
}  // namespace engine
