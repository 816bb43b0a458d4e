// Files from a model hub or a dataset cannot make the engine read without end, wait forever or
// exhaust memory: a tokenizer config or data file that is a symlink to /dev/zero or /dev/urandom,
// a chat template that is a FIFO, a data line of any size or depth. Each is refused at once with a
// message naming the file (or FILE:LINE) and a non-zero exit, and the limits can be set for a run
// through ENGINE_FILE_LIMITS, which `engine check` prints.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;
using testing::RunEngine;
namespace fs = std::filesystem;

const fs::path kHubFixtures = testing::kFixtureDir;

// A chat stage on `dir`/data.jsonl with the tokenizer and its config in `dir`.
class HubFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::copy_file(kHubFixtures / "tokenizers/qwen2_bpe.json", dir_.path() / "tokenizer.json");
    fs::copy_file(kHubFixtures / "chat_data/tokenizer_config.json",
                  dir_.path() / "tokenizer_config.json");
    fs::copy_file(kHubFixtures / "chat_data/conversations.jsonl", dir_.path() / "data.jsonl");
    pipeline_ = dir_.Write(
        "p.pbtxt",
        "output_dir: \"out\"\n"
        "stage { name: \"chat\" model { plugin: \"llama\" options { "
        "[type.googleapis.com/engine.transformer.LlamaOptions] { hidden_size: 32 "
        "num_hidden_layers: 1 num_attention_heads: 4 num_key_value_heads: 2 } } }\n"
        "data { plugin: \"chat\" options { [type.googleapis.com/engine.plugins.ChatOptions] { "
        "path: \"data.jsonl\" eval_fraction: 0 tokenizer { kind: HF_JSON path: "
        "\"tokenizer.json\" } } } } }\n");
  }

  // `engine check` of the pipeline, which opens the data; fails the test past 60 s.
  testing::CommandResult Check(std::map<std::string, std::string> env = {}) {
    const auto start = std::chrono::steady_clock::now();
    auto result = RunEngine({"check", pipeline_.string()}, dir_.path().string(), std::move(env));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
    return result;
  }

  void ReplaceWithSymlink(const std::string& name, const fs::path& target) {
    fs::remove(dir_.path() / name);
    fs::create_symlink(target, dir_.path() / name);
  }

  testing::TempDir dir_;
  fs::path pipeline_;
};

TEST_F(HubFilesTest, TheFixturePipelineChecksAndItsPlanPrintsTheLimits) {
  auto r = Check();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  file limits config 64 MiB, tokenizer 1 GiB, template 16 MiB, "
                               "image 256 MiB, data 8 GiB, data_line 16 MiB (ENGINE_FILE_LIMITS)"));
  r = Check({{"ENGINE_FILE_LIMITS", "data_line=1MiB,image=512MiB"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("image 512 MiB, data 8 GiB, data_line 1 MiB"));
}

TEST_F(HubFilesTest, ConfigsAndDataThatAreDevicesAreRefusedNamingTheFile) {
  ReplaceWithSymlink("tokenizer_config.json", "/dev/zero");
  auto r = Check();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("'" + (dir_.path() / "tokenizer_config.json").string() +
                               "' is a character device, not a regular config file"));

  fs::copy_file(kHubFixtures / "chat_data/tokenizer_config.json", dir_.path() / "config_copy.json");
  ReplaceWithSymlink("tokenizer_config.json", dir_.path() / "config_copy.json");
  ReplaceWithSymlink("data.jsonl", "/dev/urandom");
  r = Check();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("data.jsonl' is a character device, not a regular data file"));
}

TEST_F(HubFilesTest, AChatTemplateThatIsAFifoIsRefusedWithoutWaiting) {
  ASSERT_EQ(::mkfifo((dir_.path() / "chat_template.jinja").c_str(), 0600), 0);
  auto r = Check();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("chat_template.jinja' is a FIFO, not a regular template file"));
}

TEST_F(HubFilesTest, DataLinesOverTheLimitOrNestedWithoutEndAreRefusedByLine) {
  const std::string good = testing::ReadText(dir_.path() / "data.jsonl");
  const nlohmann::json long_line = {{"messages",
                                     {{{"role", "user"}, {"content", std::string(2000, 'a')}},
                                      {{"role", "assistant"}, {"content", "b"}}}}};
  dir_.Write("data.jsonl", good + long_line.dump() + "\n");
  const int line = 1 + static_cast<int>(std::count(good.begin(), good.end(), '\n'));
  const std::string where = (dir_.path() / "data.jsonl").string() + ":" + std::to_string(line);
  auto r = Check({{"ENGINE_FILE_LIMITS", "data_line=1KiB"}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr(where + " is larger than the 1 KiB limit for data_lines (set "
                                       "ENGINE_FILE_LIMITS=data_line=SIZE to allow more)"));
  r = Check();
  EXPECT_EQ(r.exit_code, 0) << r.err;

  dir_.Write("data.jsonl", good + "{\"messages\": " + std::string(100000, '[') +
                               std::string(100000, ']') + "}\n");
  r = Check();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr(where + ": nested more than 64 arrays or objects deep"));
}

TEST_F(HubFilesTest, FilesOverTheirKindsLimitAreRefusedWithTheWayToRaiseIt) {
  auto r = Check({{"ENGINE_FILE_LIMITS", "tokenizer=4KiB"}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("tokenizer.json' is larger than the 4 KiB limit for tokenizer "
                               "files (set ENGINE_FILE_LIMITS=tokenizer=SIZE to allow more)"));
}

// An id of 2^31 - 2 in tokenizer.json used to end in a bare std::bad_alloc.
TEST_F(HubFilesTest, ATokenizerIdFarBeyondItsVocabularyIsRefusedBeforeAnythingIsAllocated) {
  nlohmann::json tokenizer =
      nlohmann::json::parse(testing::ReadText(dir_.path() / "tokenizer.json"));
  tokenizer["added_tokens"].push_back({{"id", 2147483646},
                                       {"content", "<huge>"},
                                       {"single_word", false},
                                       {"lstrip", false},
                                       {"rstrip", false},
                                       {"normalized", false},
                                       {"special", true}});
  dir_.Write("tokenizer.json", tokenizer.dump());
  auto r = Check();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("model loader 'llama': vocab_size 2147483647 is above the largest "
                               "this loader builds (4194304)"));
}

TEST_F(HubFilesTest, AMalformedLimitsVariableIsAUsageErrorBeforeAnyWork) {
  for (const auto& [setting, message] : std::vector<std::pair<std::string, std::string>>{
           {"images=1GiB",
            "ENGINE_FILE_LIMITS item 'images=1GiB' is not KIND=SIZE with KIND one "
            "of config, tokenizer, template, image, data, data_line"},
           {"image=1TB", "ENGINE_FILE_LIMITS item 'image=1TB': '1TB' is not a size"},
           {"data=0", "ENGINE_FILE_LIMITS item 'data=0': a limit of 0 would refuse every file"},
           {"data=999999999999GiB",
            "ENGINE_FILE_LIMITS item 'data=999999999999GiB': "
            "'999999999999GiB' is more than 2^64 bytes"}}) {
    SCOPED_TRACE(setting);
    auto r = Check({{"ENGINE_FILE_LIMITS", setting}});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("engine check: " + message));
  }
}

}  // namespace
}  // namespace engine
