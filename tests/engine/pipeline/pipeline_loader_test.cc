// Reading pipelines: both parse passes, error positions (also inside plugin options), and the
// checks that need no model or data.
#include "pipeline/pipeline_loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pipeline/pipeline_parser.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

class PipelineLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(registry_.LoadDirectory(testing::kBuiltinPluginDir).ok()); }

  // Loads `text` as p.pbtxt; returns the diagnostics, one per line.
  std::vector<std::string> Errors(const std::string& text) {
    pipeline_ = Load(text);
    std::vector<std::string> out;
    for (const Diagnostic& d : diagnostics_.entries()) out.push_back(d.ToString());
    return out;
  }

  std::unique_ptr<ResolvedPipeline> Load(const std::string& text) {
    diagnostics_ = Diagnostics();
    auto file = dir_.Write("p.pbtxt", text);
    return LoadPipeline(file, {}, &registry_, &diagnostics_);
  }

  std::string Prefix() const { return (dir_.path() / "p.pbtxt").string() + ":"; }

  testing::TempDir dir_;
  PluginRegistry registry_;
  Diagnostics diagnostics_;
  std::unique_ptr<ResolvedPipeline> pipeline_;
};

constexpr char kGoodStage[] = R"(
stage {
  name: "train"
  model { plugin: "mlp" }
  data {
    plugin: "digits"
    options {
      [type.googleapis.com/engine.plugins.DigitsOptions] {
        path: "digits.csv.gz"
        eval_fraction: 0.25
      }
    }
  }
}
)";

TEST_F(PipelineLoaderTest, ReadsAGoodPipelineWithDefaults) {
  auto p = Load(std::string("seed: 3\n") + kGoodStage);
  ASSERT_NE(p, nullptr) << diagnostics_.ToString();
  EXPECT_EQ(p->name, "p");
  EXPECT_EQ(p->seed, 3u);
  EXPECT_EQ(p->output_dir, dir_.path() / "runs" / "p");
  ASSERT_EQ(p->stages.size(), 1u);
  const ResolvedStage& s = p->stages[0];
  EXPECT_EQ(s.name, "train");
  EXPECT_EQ(s.seed, 3u);
  EXPECT_EQ(s.model.entry->name, "mlp");
  EXPECT_EQ(s.precision.entry->name, "auto") << "auto is the default precision policy (F11)";
  // "auto": the first GPU where LibTorch has CUDA and sees one, else the CPU.
  EXPECT_EQ(s.device.device, compat::CudaAvailable() ? "cuda:0" : "cpu");
  EXPECT_EQ(s.data.options->GetDescriptor()->full_name(), "engine.plugins.DigitsOptions");
  EXPECT_THAT(s.data.options->ShortDebugString(), HasSubstr("eval_fraction: 0.25"));
  EXPECT_EQ(s.data.context, "stage 'train' data loader 'digits'");
}

TEST_F(PipelineLoaderTest, SyntaxErrorHasItsPosition) {
  EXPECT_THAT(
      Errors("name: \"x\"\nstage {\n  name: \"a\"\n  model { plugin: \"mlp\" \n}\n"),
      ::testing::ElementsAre(Prefix() + "6:1: error: Expected identifier, got: the end of the file "
                                        "(is a '}' missing?)"));
  EXPECT_THAT(Errors("name: \"x\" stage { name: 3 }"),
              ::testing::ElementsAre(HasSubstr(Prefix() + "1:25: error: Expected string")));
}

TEST_F(PipelineLoaderTest, UnknownFieldIsNamedWithASuggestion) {
  auto errors = Errors("stage {\n  name: \"a\"\n  schedul { batch_size: 4 }\n}\n");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], HasSubstr(Prefix() + "3:"));
  EXPECT_THAT(errors[0], HasSubstr("has no field named \"schedul\""));
  EXPECT_THAT(errors[0], HasSubstr("did you mean \"schedule\"?"));
}

TEST_F(PipelineLoaderTest, UnknownOptionsTypeSaysWhatThePluginTakes) {
  auto errors = Errors(R"(stage {
  name: "a"
  model { plugin: "mlp" }
  data { plugin: "digits" options { [type.googleapis.com/engine.plugins.NoSuch] { x: 1 } } }
})");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], Prefix() +
                           "4:27: error: options type 'engine.plugins.NoSuch' is not defined by "
                           "any loaded plugin; data loader 'digits' takes "
                           "'engine.plugins.DigitsOptions'");
}

TEST_F(PipelineLoaderTest, OptionsOfAnotherPluginsTypeAreRefused) {
  auto errors = Errors(R"(stage {
  name: "a"
  model { plugin: "mlp" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "x" } } }
  data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "x" } } }
})");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], Prefix() +
                           "3:25: error: stage 'a' model loader 'mlp': options of type "
                           "'engine.plugins.DigitsOptions' were given, but this plugin takes "
                           "'engine.plugins.MlpOptions'");
}

TEST_F(PipelineLoaderTest, PluginOptionErrorsPointInsideTheOptions) {
  auto errors = Errors(
      "stage {\n  name: \"a\"\n  model { plugin: \"mlp\" }\n"
      "  data {\n    plugin: \"digits\"\n    options {\n"
      "      [type.googleapis.com/engine.plugins.DigitsOptions] {\n"
      "\tpath: \"x\"\n"
      "\t  eval_fraction: 1.5\n"
      "      }\n    }\n  }\n}\n");
  ASSERT_EQ(errors.size(), 1u);
  // A tab counts to the next multiple of 8, as protobuf's tokenizer counts columns.
  EXPECT_EQ(errors[0], Prefix() +
                           "9:11: error: stage 'a' data loader 'digits': options.eval_fraction: "
                           "must be in [0, 1) (got 1.5)");
}

TEST_F(PipelineLoaderTest, RequiredOptionsAreEnforced) {
  auto errors = Errors(R"(stage {
  name: "a"
  model { plugin: "mlp" }
  data { plugin: "digits" }
})");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], HasSubstr(Prefix() + "4:3: error: stage 'a' data loader 'digits': "
                                              "options.path is required (digits.csv.gz from"));
}

TEST_F(PipelineLoaderTest, UnknownPluginListsWhatIsInstalled) {
  auto errors = Errors(R"(stage {
  name: "a"
  model { plugin: "digits" }
  data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "x" } } }
  quantizer { plugin: "nf5" }
})");
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0],
            Prefix() +
                "3:11: error: stage 'a': unknown model loader plugin 'digits'; "
                "installed model loader plugins: llama, mlp, qwen2_5_vl, qwen2_vl, qwen3_vl, "
                "vlm "
                "('digits' is a data loader)");
  EXPECT_EQ(errors[1], Prefix() +
                           "5:15: error: stage 'a': unknown quantizer plugin 'nf5'; installed "
                           "quantizer plugins: int8, nf4");
}

TEST_F(PipelineLoaderTest, BadValuesAreAllReportedWithPositions) {
  auto errors = Errors(R"(stage {
  name: "a"
  model { plugin: "mlp" options { [type.googleapis.com/engine.plugins.MlpOptions] { hidden_units: 8 hidden_units: 0 dropout: 1 } } }
  data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "x" } } }
  optimizer {
    learning_rate: -0.1
    adamw { beta1: 1.0 epsilon: 0 }
    lr_schedule { warmup_steps: 5 }
    max_grad_norm: -1
  }
  schedule { batch_size: 0 gradient_accumulation_steps: 0 epochs: 0 }
  parallel { device: "tpu" }
  trainable { include: "layers.[0" }
})");
  EXPECT_THAT(errors,
              ::testing::ElementsAre(
                  Prefix() + "3:101: error: stage 'a' model loader 'mlp': options.hidden_units[1]: "
                             "a layer needs at least one unit",
                  Prefix() + "3:117: error: stage 'a' model loader 'mlp': options.dropout: must "
                             "be in [0, 1) (got 1)",
                  Prefix() + "13:15: error: stage 'a': trainable.include pattern 'layers.[0': "
                             "'[' at position 8 is never closed by ']'",
                  Prefix() + "6:5: error: stage 'a': optimizer.learning_rate must be a positive "
                             "number (got -0.1)",
                  Prefix() + "9:5: error: stage 'a': optimizer.max_grad_norm must be >= 0 (0 "
                             "turns clipping off; got -1)",
                  Prefix() + "7:13: error: stage 'a': optimizer.adamw.beta1 must be in [0, 1) "
                             "(got 1)",
                  Prefix() + "7:24: error: stage 'a': optimizer.adamw.epsilon must be > 0 (got 0)",
                  Prefix() + "8:19: error: stage 'a': optimizer.lr_schedule.warmup_steps needs "
                             "kind LINEAR_WARMUP or COSINE (a CONSTANT schedule has no warm-up)",
                  Prefix() + "11:14: error: stage 'a': schedule.batch_size must be > 0 (got 0)",
                  Prefix() + "11:28: error: stage 'a': schedule.gradient_accumulation_steps must "
                             "be > 0 (got 0)",
                  Prefix() + "11:59: error: stage 'a': schedule.epochs must be > 0 (got 0)",
                  Prefix() + "12:14: error: stage 'a': parallel.device 'tpu' is not a device; use "
                             "\"cpu\", \"cuda\", \"cuda:N\" or \"auto\""));
}

TEST_F(PipelineLoaderTest, CudaOnACpuOnlyLibTorchIsRefused) {
  if (compat::CudaAvailable()) GTEST_SKIP() << "this LibTorch has CUDA";
  auto errors = Errors(std::string(kGoodStage)
                           .replace(std::string(kGoodStage).find("  model"), 0,
                                    "  parallel { device: \"cuda\" }\n"));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], HasSubstr("parallel.device 'cuda' was requested, but this LibTorch"));
}

TEST_F(PipelineLoaderTest, StageNamesAndTheGraph) {
  const std::string stage_a =
      "stage { name: \"a\" model { plugin: \"mlp\" } data { plugin: "
      "\"digits\" options { [type.googleapis.com/engine.plugins."
      "DigitsOptions] { path: \"x\" } } } ";
  auto errors =
      Errors(stage_a + "}\n" + stage_a + "}\n" + stage_a + "after: \"nope\" from_stage: \"a\" }\n");
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_EQ(errors[0], Prefix() + "2:9: error: stage name 'a' is used twice (first at line 1)");
  EXPECT_EQ(errors[1], Prefix() + "3:9: error: stage name 'a' is used twice (first at line 1)");
  EXPECT_EQ(errors[2], Prefix() + "3:146: error: stage 'a': `after` names an unknown stage 'nope'");

  auto cycle = Errors(
      R"(stage { name: "a" after: "c" model { plugin: "mlp" } data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "x" } } } }
stage { name: "b" after: "a" model { plugin: "mlp" } data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "x" } } } }
stage { name: "c" from_stage: "b" model { plugin: "mlp" } data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "x" } } } }
stage { name: "bad/name" model { plugin: "mlp" } data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "x" } } } }
)");
  ASSERT_EQ(cycle.size(), 1u);
  EXPECT_THAT(cycle[0], HasSubstr("stage name 'bad/name' may only hold letters"));

  auto only_cycle = Errors(
      R"(stage { name: "a" after: "c" model { plugin: "mlp" } data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "x" } } } }
stage { name: "b" after: "a" model { plugin: "mlp" } data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "x" } } } }
stage { name: "c" from_stage: "b" model { plugin: "mlp" } data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "x" } } } }
)");
  ASSERT_EQ(only_cycle.size(), 1u);
  EXPECT_EQ(only_cycle[0], Prefix() +
                               "1:1: error: the stages form a cycle: 'a' -> 'c' -> 'b' -> "
                               "'a' (each waits for the next)");
}

TEST_F(PipelineLoaderTest, NewTensorsNeedAFromStageAndWellFormedPatterns) {
  const std::string stage =
      "model { plugin: \"mlp\" } data { plugin: \"digits\" options { "
      "[type.googleapis.com/engine.plugins.DigitsOptions] { path: \"x\" } } } }\n";
  auto errors = Errors("stage { name: \"a\" new_tensors: \"visual.*\" " + stage +
                       "stage { name: \"b\" from_stage: \"a\"\n new_tensors: \"ok.*\" "
                       "new_tensors: \"bad[\" " +
                       stage);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0], Prefix() +
                           "1:19: error: stage 'a': new_tensors names tensors a from_stage parent "
                           "lacks, and this stage has no from_stage");
  EXPECT_THAT(errors[1], ::testing::StartsWith(Prefix() + "3:22: error: stage 'b': new_tensors "
                                                          "pattern 'bad[': "));
}

TEST_F(PipelineLoaderTest, RunOrderFollowsDependenciesThenFileOrder) {
  const std::string tail =
      " model { plugin: \"mlp\" } data { plugin: \"digits\" options { "
      "[type.googleapis.com/engine.plugins.DigitsOptions] { path: \"x\" } } "
      "} }\n";
  auto p = Load("stage { name: \"late\" from_stage: \"early\"" + tail + "stage { name: \"other\"" +
                tail + "stage { name: \"early\"" + tail);
  ASSERT_NE(p, nullptr) << diagnostics_.ToString();
  EXPECT_EQ(p->run_order, (std::vector<int>{1, 2, 0}));
  EXPECT_EQ(p->stages[0].from_stage, 2);
}

TEST_F(PipelineLoaderTest, OutputDirectoryMustBeWritable) {
  dir_.Write("a_file", "x");
  auto errors = Errors("output_dir: \"a_file/out\"\n" + std::string(kGoodStage));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], Prefix() + "1:1: error: output directory '" +
                           (dir_.path() / "a_file/out").string() + "' cannot be created: '" +
                           (dir_.path() / "a_file").string() + "' is not a directory");
}

TEST_F(PipelineLoaderTest, EmptyPipelineAndUnreadableFile) {
  EXPECT_THAT(Errors("name: \"x\"\n"), ::testing::ElementsAre(HasSubstr("has no stage")));
  Diagnostics diagnostics;
  EXPECT_EQ(LoadPipeline(dir_.path() / "missing.pbtxt", {}, &registry_, &diagnostics), nullptr);
  EXPECT_THAT(diagnostics.ToString(), HasSubstr("cannot read the pipeline"));
}

TEST_F(PipelineLoaderTest, PipelineNamedPluginLibraryMustLoad) {
  auto errors = Errors("plugin_library: \"" + std::string(testing::kTestPluginDir) +
                       "/wrong_api/engine_wrong_api.so\"\n" + kGoodStage);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], HasSubstr(Prefix() + "1:1: error: plugin library"));
  EXPECT_THAT(errors[0], HasSubstr("API 999"));
}

TEST_F(PipelineLoaderTest, PipelinePluginPathAddsPlugins) {
  auto p =
      Load("plugin_path: \"" + std::string(testing::kTestPluginDir) + "/throwing_callback\"\n" +
           std::string(kGoodStage)
               .replace(std::string(kGoodStage).rfind('}'), 1,
                        "callback { plugin: \"throwing_callback\" on_error: WARN } }"));
  ASSERT_NE(p, nullptr) << diagnostics_.ToString();
  ASSERT_EQ(p->stages[0].callbacks.size(), 1u);
  EXPECT_EQ(p->stages[0].callbacks[0].on_error, proto::CallbackRef::WARN);
}

TEST(PipelineParserTest, HeaderPassSkipsUnknownOptionTypes) {
  const std::string text = R"(plugin_library: "libx.so"
plugin_path: "dir"
stage { name: "a" data { plugin: "p" options { [type.googleapis.com/x.Unknown] { a: 1 b { c: "d" } } } } }
)";
  proto::Pipeline header;
  Diagnostics diagnostics;
  ASSERT_TRUE(ParsePipelineHeader("f", text, &header, nullptr, &diagnostics))
      << diagnostics.ToString();
  EXPECT_EQ(header.plugin_library(0), "libx.so");
  EXPECT_EQ(header.plugin_path(0), "dir");
  EXPECT_EQ(header.stage(0).data().options().type_url(), "type.googleapis.com/x.Unknown");
  std::vector<std::string> paths;
  ForEachAny(header,
             [&](const std::string& path, const google::protobuf::Any&) { paths.push_back(path); });
  EXPECT_EQ(paths, std::vector<std::string>{"stage[0].data.options"});
  EXPECT_EQ(TypeNameFromUrl("type.googleapis.com/a.b.C"), "a.b.C");
}

}  // namespace
}  // namespace engine
