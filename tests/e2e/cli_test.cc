// The `engine` command as a user meets it: help, plugins, and every kind of bad input giving a
// clear error with its position and a non-zero exit, with nothing written.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "testing/pipelines.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunEngine;

std::string FixtureDir(const std::string& name) {
  return std::string(testing::kTestPluginDir) + "/" + name;
}

TEST(CliTest, HelpAndUsage) {
  auto none = RunEngine({});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.err, HasSubstr("usage: engine <command>"));
  auto help = RunEngine({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("plugins describe NAME"));
  for (const std::string command : {"check", "run", "plugins"}) {
    auto r = RunEngine({command, "--help"});
    EXPECT_EQ(r.exit_code, 0) << command;
    EXPECT_THAT(r.out, HasSubstr("usage: engine " + command)) << command;
    EXPECT_EQ(RunEngine({"help", command}).out, r.out);
  }
  auto unknown = RunEngine({"train"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("unknown command 'train'"));
  EXPECT_EQ(RunEngine({"--version"}).out, "engine 0.1.0\n");
}

TEST(CliTest, WrongCommandLinesExitWithTwo) {
  auto no_file = RunEngine({"check"});
  EXPECT_EQ(no_file.exit_code, 2);
  EXPECT_THAT(no_file.err, HasSubstr("engine check: expected one pipeline file"));
  auto format = RunEngine({"check", "p.pbtxt", "--format=xml"});
  EXPECT_EQ(format.exit_code, 2);
  EXPECT_THAT(format.err, HasSubstr("--format must be text or json, not 'xml'"));
  auto flag = RunEngine({"run", "p.pbtxt", "--epochs=3"});
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_THAT(flag.err, HasSubstr("unknown flag '--epochs=3'"));
  EXPECT_EQ(RunEngine({"plugins", "describe"}).exit_code, 2);
}

TEST(CliTest, PluginsListsTheBuiltins) {
  auto r = RunEngine({"plugins"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("^NAME +KIND +VERSION +LIBRARY\n"));
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"mlp", "model_loader"},           {"digits", "data_loader"},
      {"auto", "precision_policy"},      {"bf16-mixed", "precision_policy"},
      {"bf16-true", "precision_policy"}, {"fp16-mixed", "precision_policy"},
      {"fp16-true", "precision_policy"}, {"fp32", "precision_policy"},
      {"checkpoint_every", "callback"},  {"early_stopping", "callback"},
      {"memory_monitor", "callback"},    {"metrics_jsonl", "callback"},
      {"progress", "callback"},          {"tensorboard", "callback"}};
  for (const auto& [name, kind] : expected) {
    EXPECT_THAT(r.out, ::testing::ContainsRegex("\n" + name + " +" + kind + " +0\\.1\\.0 +/"))
        << name;
  }
  EXPECT_THAT(r.out, HasSubstr(std::string(testing::kBuiltinPluginDir) + "/engine_mlp.so"));
  EXPECT_EQ(r.err, "");
}

TEST(CliTest, PluginPathFlagAndEnvironment) {
  auto flag = RunEngine({"plugins", "--plugin_path=" + FixtureDir("throwing_callback")});
  EXPECT_EQ(flag.exit_code, 0);
  EXPECT_THAT(flag.out, HasSubstr("throwing_callback"));
  auto env = RunEngine({"plugins"}, "", {{"ENGINE_PLUGIN_PATH", FixtureDir("throwing_callback")}});
  EXPECT_THAT(env.out, HasSubstr("throwing_callback"));
  auto broken = RunEngine(
      {"plugins", "--plugin_path", FixtureDir("wrong_api") + ":" + FixtureDir("not_a_library")});
  EXPECT_EQ(broken.exit_code, 0);
  EXPECT_THAT(broken.err, HasSubstr("skipped: plugin library"));
  EXPECT_THAT(broken.err, HasSubstr("API 999"));
  auto dup = RunEngine({"plugins"}, "", {{"ENGINE_PLUGIN_PATH", FixtureDir("dup_digits")}});
  EXPECT_EQ(dup.exit_code, 1);
  EXPECT_THAT(dup.err, HasSubstr("the data loader plugin 'digits' is provided by two libraries: '" +
                                 std::string(testing::kBuiltinPluginDir) +
                                 "/engine_digits.so' "
                                 "and '" +
                                 FixtureDir("dup_digits") + "/engine_dup_digits.so'"));
}

TEST(CliTest, DescribeSnippetPastesIntoAWorkingPipeline) {
  auto r = RunEngine({"plugins", "describe", "digits"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("options: engine.plugins.DigitsOptions"));
  EXPECT_THAT(r.out, HasSubstr("eval_fraction  (double, default 0.2)"));
  EXPECT_THAT(r.out, HasSubstr("path  (string, required)"));
  const std::string marker = "snippet for a stage:\n\n";
  std::string snippet = r.out.substr(r.out.find(marker) + marker.size());
  const std::string empty_path = "path: \"\"";
  snippet.replace(snippet.find(empty_path), empty_path.size(),
                  "path: \"" + testing::DigitsDataPath().string() + "\"");
  testing::TempDir dir;
  auto file =
      dir.Write("p.pbtxt", "stage {\n name: \"s\"\n model { plugin: \"mlp\" }\n" + snippet + "}\n");
  auto check = RunEngine({"check", file.string()});
  EXPECT_EQ(check.exit_code, 0) << check.err;

  auto fp32 = RunEngine({"plugins", "describe", "fp32"});
  EXPECT_THAT(fp32.out, HasSubstr("options: engine.proto.PrecisionOptions"));
  EXPECT_THAT(fp32.out, HasSubstr("keep_fp32  (repeated string)"));
  EXPECT_THAT(fp32.out, HasSubstr("precision {\n    plugin: \"fp32\"\n    options {\n      "
                                  "[type.googleapis.com/engine.proto.PrecisionOptions] {"));
  auto nf4 = RunEngine({"plugins", "describe", "nf4"});
  EXPECT_EQ(nf4.exit_code, 0);
  EXPECT_THAT(nf4.out, HasSubstr("quantizer {\n    plugin: \"nf4\""));
  // compute_dtype unset follows the stage: the snippet leaves it out, so pasting it pins no dtype.
  EXPECT_THAT(nf4.out, HasSubstr("# compute_dtype: BF16  (unset: see describe)"));
  EXPECT_THAT(nf4.out, HasSubstr("double_quant: true\n"));
  auto missing = RunEngine({"plugins", "describe", "nf5"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("no plugin named 'nf5' is installed"));
}

// A pipeline on the real data with `stage_extra` inside its only stage.
std::string CliPipeline(const std::string& stage_extra, const std::string& output_dir = "out") {
  return "output_dir: \"" + output_dir + "\"\n" + testing::DigitsStage("s", stage_extra);
}

struct BadInput {
  std::string name;
  std::string text;
  std::string expected;  // a fragment of stderr, with its position
};

TEST(CliTest, BadInputsAreErrorsWithPositionsAndWriteNothing) {
  const std::vector<BadInput> cases = {
      {"malformed", "stage {\n  name: \"s\"\n", "p.pbtxt:3:1: error: Expected identifier, got: "},
      {"unknown field", CliPipeline("  epochs: 3"),
       "p.pbtxt:6:9: error: Message type \"engine.proto.Stage\" has no field named \"epochs\""},
      {"unknown plugin", CliPipeline("  precision { plugin: \"bf16-mixd\" }"),
       "p.pbtxt:6:15: error: stage 's': unknown precision policy plugin 'bf16-mixd'; installed "
       "precision policy plugins: auto, bf16-mixed, bf16-true, fp16-mixed, fp16-true, fp32"},
      {"wrong options type",
       CliPipeline("  callback { plugin: \"progress\" options { "
                   "[type.googleapis.com/engine.plugins.MlpOptions] {} } }"),
       "p.pbtxt:6:33: error: stage 's' callback 'progress': options of type "
       "'engine.plugins.MlpOptions' were given, but this plugin takes "
       "'engine.plugins.ProgressOptions'"},
      {"negative learning rate", CliPipeline("  optimizer { learning_rate: -0.001 }"),
       "p.pbtxt:6:15: error: stage 's': optimizer.learning_rate must be a positive number (got "
       "-0.001)"},
      {"zero batch size", CliPipeline("  schedule { batch_size: 0 }"),
       "p.pbtxt:6:14: error: stage 's': schedule.batch_size must be > 0 (got 0)"},
      {"missing data file",
       "output_dir: \"out\"\nstage { name: \"s\" model { plugin: \"mlp\" } data { plugin: "
       "\"digits\" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "
       "\"nope.csv.gz\" } } } }\n",
       "p.pbtxt:2:67: error: stage 's' data loader 'digits': cannot open"},
      {"unwritable output directory", CliPipeline("", "/proc/version/out"),
       "p.pbtxt:1:1: error: output directory '/proc/version/out' cannot be created: "
       "'/proc/version' is not a directory"},
      {"duplicate stage names",
       CliPipeline("") + CliPipeline("").substr(CliPipeline("").find("stage")),
       "p.pbtxt:9:3: error: stage name 's' is used twice (first at line 3)"},
  };
  for (const BadInput& c : cases) {
    testing::TempDir dir;
    dir.Write("p.pbtxt", c.text);
    for (const std::string command : {"check", "run"}) {
      auto r = RunEngine({command, "p.pbtxt"}, dir.path().string());
      EXPECT_EQ(r.exit_code, 1) << c.name << " (" << command << ")\n" << r.err;
      EXPECT_THAT(r.err, HasSubstr(c.expected)) << c.name << " (" << command << ")";
      EXPECT_THAT(r.out, Not(HasSubstr("stage 's':"))) << c.name << ": nothing may run";
      EXPECT_FALSE(std::filesystem::exists(dir.path() / "out")) << c.name << ": wrote output";
    }
  }
}

TEST(CliTest, CheckAsJson) {
  testing::TempDir dir;
  auto good = dir.Write("good.pbtxt", CliPipeline("  schedule { epochs: 2 }"));
  auto r = RunEngine({"check", good.string(), "--format=json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["valid"], true);
  EXPECT_EQ(j["plan"]["stages"][0]["schedule"]["total_steps"], 90);

  auto bad = dir.Write("bad.pbtxt", CliPipeline("  schedule { batch_size: 0 }"));
  r = RunEngine({"check", bad.string(), "--format", "json"});
  EXPECT_EQ(r.exit_code, 1);
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["valid"], false);
  ASSERT_EQ(j["errors"].size(), 1u);
  EXPECT_EQ(j["errors"][0]["line"], 6);
  EXPECT_EQ(j["errors"][0]["column"], 14);
  EXPECT_EQ(j["errors"][0]["message"], "stage 's': schedule.batch_size must be > 0 (got 0)");
}

TEST(CliTest, DuplicatePluginOnThePathStopsCheck) {
  testing::TempDir dir;
  auto file = dir.Write("p.pbtxt", CliPipeline(""));
  auto r = RunEngine({"check", file.string(), "--plugin_path=" + FixtureDir("dup_digits")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("is provided by two libraries"));
}

// A plugin's plain accessors (a dataset's description(), say) are called behind the same guard as
// everything else it does: one that throws is an error naming the plugin at check time.
TEST(CliTest, APluginThatThrowsFromAnAccessorIsAnErrorNamingIt) {
  testing::TempDir dir;
  const auto file =
      dir.Write("p.pbtxt", "plugin_path: \"" + FixtureDir("misbehaving_loader") +
                               "\"\nstage {\n  name: \"s\"\n  model { plugin: \"mlp\" }\n"
                               "  data { plugin: \"misbehaving_loader\" options { "
                               "[type.googleapis.com/engine.fixtures.MisbehavingLoaderOptions] { "
                               "misbehaviour: THROW_IN_DESCRIPTION } } }\n}\n");
  auto r = RunEngine({"check", file.string()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("p.pbtxt:5:3: error: stage 's' data loader 'misbehaving_loader': "
                               "the fixture throws from description()"));
}

}  // namespace
}  // namespace engine
