#include "plan/pipeline_plan.h"

#include <ATen/ops/equal.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pipeline/pipeline_loader.h"
#include "plan/plan_printer.h"
#include "testing/pipelines.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

class PipelinePlanTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(registry_.LoadDirectory(testing::kBuiltinPluginDir).ok()); }

  // A stage on the real digits data; `extra` goes inside the stage.
  std::string Stage(const std::string& name, const std::string& extra,
                    const std::string& model_options = "") {
    return testing::DigitsStage(name, extra, model_options);
  }

  std::unique_ptr<PipelinePlan> Plan(const std::string& text,
                                     PlanModels models = PlanModels::kKeep) {
    diagnostics_ = Diagnostics();
    auto file = dir_.Write("p.pbtxt", text);
    pipeline_ = LoadPipeline(file, {}, &registry_, &diagnostics_);
    if (pipeline_ == nullptr) return nullptr;
    return BuildPlan(*pipeline_, &diagnostics_, models);
  }

  testing::TempDir dir_;
  PluginRegistry registry_;
  Diagnostics diagnostics_;
  std::unique_ptr<ResolvedPipeline> pipeline_;
};

TEST_F(PipelinePlanTest, CountsStepsFromDataAndSchedule) {
  // 1,797 images, 20% held out: 1,438 train / 359 eval.
  auto plan = Plan(Stage("a", "schedule { epochs: 3 batch_size: 100 }"));
  ASSERT_NE(plan, nullptr) << diagnostics_.ToString();
  const StagePlan& s = plan->stages[0];
  EXPECT_EQ(s.train_examples, 1438);
  EXPECT_EQ(s.eval_examples, 359);
  EXPECT_EQ(s.micro_batches_per_epoch, 15);
  EXPECT_EQ(s.steps_per_epoch, 15);
  EXPECT_EQ(s.total_steps, 45);
  EXPECT_EQ(s.global_batch, 100);
  EXPECT_EQ(s.world_size, 1);
  EXPECT_EQ(s.eval_batch_size, 100);

  plan = Plan(Stage("a",
                    "schedule { epochs: 2 batch_size: 100 gradient_accumulation_steps: 4 "
                    "drop_last: true eval_batch_size: 7 }"));
  ASSERT_NE(plan, nullptr) << diagnostics_.ToString();
  EXPECT_EQ(plan->stages[0].micro_batches_per_epoch, 14);
  EXPECT_EQ(plan->stages[0].steps_per_epoch, 4);
  EXPECT_EQ(plan->stages[0].total_steps, 8);
  EXPECT_EQ(plan->stages[0].global_batch, 400);
  EXPECT_EQ(plan->stages[0].eval_batch_size, 7);

  plan = Plan(Stage("a", "schedule { max_steps: 100 batch_size: 32 }"));
  ASSERT_NE(plan, nullptr) << diagnostics_.ToString();
  EXPECT_EQ(plan->stages[0].total_steps, 100);
  EXPECT_EQ(plan->stages[0].steps_per_epoch, 45);
  EXPECT_NEAR(plan->stages[0].epochs, 100.0 / 45, 1e-9);

  plan = Plan(Stage("a", ""));
  ASSERT_NE(plan, nullptr) << diagnostics_.ToString();
  EXPECT_EQ(plan->stages[0].total_steps, 45) << "default: one epoch of batch 32";
}

TEST_F(PipelinePlanTest, ModelIsSizedFromTheDataAndCensused) {
  auto plan = Plan(Stage("a", "", "hidden_units: 16 hidden_units: 8"));
  ASSERT_NE(plan, nullptr) << diagnostics_.ToString();
  const StagePlan& s = plan->stages[0];
  // 64*16+16 + 16*8+8 + 8*10+10
  EXPECT_EQ(s.total_parameters, 1040 + 136 + 90);
  EXPECT_EQ(s.trainable_parameters, s.total_parameters);
  ASSERT_EQ(s.census.size(), 6u);
  EXPECT_EQ(s.census[0].name, "layers.0.weight");
  EXPECT_EQ(s.census[0].numel, 1024);
  EXPECT_EQ(s.census[0].dtype, at::kFloat);
  EXPECT_EQ(s.census[5].name, "head.bias");
  ASSERT_EQ(s.precision.groups.size(), 1u);
  EXPECT_EQ(s.precision.groups[0].name, "trainable");
  EXPECT_EQ(s.precision.groups[0].bytes, 4 * s.total_parameters);
}

TEST_F(PipelinePlanTest, TrainableSelection) {
  auto plan = Plan(Stage("a",
                         "trainable { include: \"head.*\" include: \"layers.*\" exclude: "
                         "\"*.bias\" }"));
  ASSERT_NE(plan, nullptr) << diagnostics_.ToString();
  const StagePlan& s = plan->stages[0];
  EXPECT_EQ(s.trainable_tensors, 2);
  EXPECT_EQ(s.trainable_parameters, 64 * 128 + 128 * 10);
  for (const auto& e : s.census) EXPECT_EQ(e.trainable, e.name.find("bias") == std::string::npos);
  ASSERT_EQ(s.precision.groups.size(), 2u);
  EXPECT_EQ(s.precision.groups[1].name, "frozen");
  EXPECT_FALSE(s.precision.groups[1].has_grad);
}

TEST_F(PipelinePlanTest, PatternThatMatchesNothingIsAnError) {
  EXPECT_EQ(Plan(Stage("a", "trainable { include: \"visual.*\" }")), nullptr);
  EXPECT_THAT(diagnostics_.ToString(),
              HasSubstr("p.pbtxt:5:13: error: stage 'a': trainable.include pattern 'visual.*' "
                        "matches no parameter; parameters are named like 'layers.0.weight', "
                        "'layers.0.bias', 'head.weight', 'head.bias'"));
  EXPECT_EQ(Plan(Stage("a", "trainable { exclude: \"*\" }")), nullptr);
  EXPECT_THAT(diagnostics_.ToString(),
              HasSubstr("the trainable selection leaves no parameter to train"));
}

TEST_F(PipelinePlanTest, ScheduleThatCannotRun) {
  EXPECT_EQ(Plan(Stage("a", "schedule { batch_size: 5000 drop_last: true }")), nullptr);
  EXPECT_THAT(diagnostics_.ToString(),
              HasSubstr("schedule.batch_size 5000 is larger than the 1438 training examples"));
  EXPECT_EQ(Plan(Stage("a", "optimizer { lr_schedule { kind: COSINE warmup_steps: 46 } }")),
            nullptr);
  EXPECT_THAT(diagnostics_.ToString(),
              HasSubstr("warmup_steps (46) is longer than the stage (45 steps)"));
}

TEST_F(PipelinePlanTest, MissingDataFileIsReportedAtTheDataOptions) {
  auto plan = Plan(R"(stage {
  name: "a"
  model { plugin: "mlp" }
  data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "no/such.csv.gz" } } }
})");
  EXPECT_EQ(plan, nullptr);
  EXPECT_THAT(
      diagnostics_.ToString(),
      HasSubstr("p.pbtxt:4:27: error: stage 'a' data loader 'digits': cannot open '" +
                (dir_.path() / "no/such.csv.gz").string() + "': No such file or directory"));
}

TEST_F(PipelinePlanTest, HandoffNeedsTheSameTensors) {
  auto plan = Plan(Stage("first", "", "hidden_units: 32") +
                   Stage("second", "from_stage: \"first\"", "hidden_units: 16"));
  EXPECT_EQ(plan, nullptr);
  EXPECT_THAT(diagnostics_.ToString(),
              HasSubstr("stage 'second' starts from stage 'first', but their models do not fit: "
                        "'head.weight' is [10,32] in 'first' but [10,16] here"));
  plan = Plan(Stage("first", "", "hidden_units: 32") +
              Stage("second", "from_stage: \"first\"", "hidden_units: 32"));
  ASSERT_NE(plan, nullptr) << diagnostics_.ToString();
  EXPECT_EQ(plan->stages[1].stage->name, "second");
}

// `engine check` plans a pipeline of real-size stages one model at a time: each stage's model is
// released once planned, and the next stage's handoff is still checked against its tensors.
TEST_F(PipelinePlanTest, APlanForCheckingReleasesEachModelAndStillChecksHandoffs) {
  const std::string fits = Stage("first", "", "hidden_units: 32") +
                           Stage("second", "from_stage: \"first\"", "hidden_units: 32");
  // A plan points into its pipeline, which the next Plan replaces: what is compared is taken first.
  auto kept = Plan(fits);
  ASSERT_NE(kept, nullptr) << diagnostics_.ToString();
  EXPECT_NE(kept->stages[0].model, nullptr);
  const std::string kept_text = PlanToText(*kept);
  const std::string kept_handoff = kept->stages[1].handoff_summary;
  auto released = Plan(fits, PlanModels::kPlanOnly);
  ASSERT_NE(released, nullptr) << diagnostics_.ToString();
  EXPECT_EQ(released->stages[0].model, nullptr);
  EXPECT_EQ(released->stages[1].model, nullptr);
  EXPECT_EQ(released->stages[1].handoff_summary, kept_handoff);
  EXPECT_EQ(PlanToText(*released), kept_text);
  EXPECT_EQ(Plan(Stage("first", "", "hidden_units: 32") +
                     Stage("second", "from_stage: \"first\"", "hidden_units: 16"),
                 PlanModels::kPlanOnly),
            nullptr);
  EXPECT_THAT(diagnostics_.ToString(),
              HasSubstr("'head.weight' is [10,32] in 'first' but [10,16] here"));
}

// `engine run` plans every stage without keeping its model and builds each when its turn comes:
// the same model, with the same initial values, as planning everything for use built.
TEST_F(PipelinePlanTest, AStagesModelIsBuiltWhenItsTurnComesAsPlanningForUseBuiltIt) {
  const std::string text = Stage("first", "", "hidden_units: 32") +
                           Stage("second", "trainable { include: \"head.*\" }", "hidden_units: 16");
  auto kept = Plan(text);
  ASSERT_NE(kept, nullptr) << diagnostics_.ToString();
  const std::string kept_text = PlanToText(*kept);
  std::vector<at::Tensor> kept_values;
  for (const at::Tensor& p : kept->stages[1].model->module().parameters()) {
    kept_values.push_back(p.detach().clone());
  }

  auto planned = Plan(text, PlanModels::kPlanOnly);
  ASSERT_NE(planned, nullptr) << diagnostics_.ToString();
  EXPECT_EQ(planned->stages[0].model, nullptr);
  ASSERT_EQ(planned->stages[1].model, nullptr);
  EXPECT_EQ(PlanToText(*planned), kept_text);
  StagePlan& second = planned->stages[1];
  ASSERT_TRUE(BuildStageModel(*pipeline_, &second).ok());
  ASSERT_NE(second.model, nullptr);
  const auto parameters = second.model->module().named_parameters();
  ASSERT_EQ(parameters.size(), kept_values.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_TRUE(at::equal(parameters[i].value(), kept_values[i])) << parameters[i].key();
    EXPECT_EQ(parameters[i].value().requires_grad(), parameters[i].key().rfind("head.", 0) == 0)
        << parameters[i].key();
  }
  EXPECT_EQ(PlanToText(*planned), kept_text);

  // A model that is not the one planned (here: a plan that says otherwise) is refused, named.
  auto again = Plan(text, PlanModels::kPlanOnly);
  ASSERT_NE(again, nullptr) << diagnostics_.ToString();
  again->stages[1].census[0].trainable = !again->stages[1].census[0].trainable;
  const Status refused = BuildStageModel(*pipeline_, &again->stages[1]);
  EXPECT_THAT(refused.message(), HasSubstr("the model built to train is not the one planned"));
  EXPECT_EQ(again->stages[1].model, nullptr);
}

TEST_F(PipelinePlanTest, FingerprintFollowsMeaningNotSpelling) {
  auto a = Plan(Stage("a", "schedule { epochs: 2 }"));
  ASSERT_NE(a, nullptr);
  const std::string base = a->stages[0].fingerprint;
  EXPECT_EQ(base.size(), 16u);
  // Writing a default explicitly changes nothing.
  auto b = Plan(Stage("a", "schedule { epochs: 2 batch_size: 32 }"));
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->stages[0].fingerprint, base);
  // Changing a value, a plugin option or the seed does.
  auto c = Plan(Stage("a", "schedule { epochs: 3 }"));
  auto d = Plan(Stage("a", "schedule { epochs: 2 }", "hidden_units: 64"));
  auto e = Plan(Stage("a", "schedule { epochs: 2 } seed: 9"));
  ASSERT_TRUE(c && d && e);
  EXPECT_NE(c->stages[0].fingerprint, base);
  EXPECT_NE(d->stages[0].fingerprint, base);
  EXPECT_NE(e->stages[0].fingerprint, base);
}

TEST_F(PipelinePlanTest, TextAndJsonShowThePlan) {
  auto plan = Plan("name: \"demo\"\n" + Stage("a",
                                              "precision { plugin: \"fp32\" }\nschedule { epochs: "
                                              "2 batch_size: 64 }\ncallback { plugin: "
                                              "\"progress\" }"));
  ASSERT_NE(plan, nullptr) << diagnostics_.ToString();
  const std::string text = PlanToText(*plan);
  EXPECT_THAT(text, HasSubstr("pipeline 'demo'"));
  EXPECT_THAT(text, HasSubstr("mlp 0.1.0: 9,610 parameters, 9,610 trainable in 4 tensors, 0 "
                              "frozen"));
  EXPECT_THAT(text, HasSubstr("1,438 train / 359 eval examples; features f32[64], labels i64[] "
                              "(10 classes)"));
  EXPECT_THAT(text, HasSubstr("2 epochs x 23 steps = 46 steps; 64 examples x 1 accumulation x "
                              "1 device = 64 examples per step"));
  EXPECT_THAT(text, HasSubstr("world size 1"));
  EXPECT_THAT(text, HasSubstr("adamw lr 0.001"));
  EXPECT_THAT(text, HasSubstr("progress (on error: disable)"));

  const nlohmann::json j = PlanToJson(*plan);
  EXPECT_EQ(j["pipeline"], "demo");
  const auto& s = j["stages"][0];
  EXPECT_EQ(s["schedule"]["total_steps"], 46);
  EXPECT_EQ(s["schedule"]["steps_per_epoch"], 23);
  EXPECT_EQ(s["world_size"], 1);
  EXPECT_EQ(s["model"]["trainable_parameters"], 9610);
  EXPECT_EQ(s["data"]["eval_examples"], 359);
  EXPECT_EQ(s["precision"]["policy"], "fp32");
  EXPECT_EQ(s["precision"]["groups"][0]["master"], "f32");
  EXPECT_EQ(s["census"].size(), 4u);
  EXPECT_EQ(s["census"][0]["dtype"], "f32");
}

TEST(PlanPrinterTest, Numbers) {
  EXPECT_EQ(WithThousands(0), "0");
  EXPECT_EQ(WithThousands(999), "999");
  EXPECT_EQ(WithThousands(1000), "1,000");
  EXPECT_EQ(WithThousands(-1234567), "-1,234,567");
  EXPECT_EQ(HumanBytes(999), "999 B");
  EXPECT_EQ(HumanBytes(38440), "38.4 KB");
  EXPECT_EQ(HumanBytes(7'000'000'000), "7.0 GB");
}

}  // namespace
}  // namespace engine
