// The prompts `engine generate` reads: what each becomes before a model sees it, and the errors
// that name the line of a prompt file.
#include "run/generation_prompts.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/temp_dir.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

TEST(GenerationPromptsTest, TextsBecomeUserMessagesWithEveryImageFirstAfterTheSystemMessage) {
  const std::vector<Prompt> prompts =
      PromptsFromTexts({"What digit?", "And this?"}, {"a.png", "b.png"}, "Be brief.", false);
  ASSERT_EQ(prompts.size(), 2u);
  EXPECT_EQ(prompts[1].origin, "--prompt 2");
  EXPECT_EQ(prompts[1].messages,
            nlohmann::ordered_json::parse(R"([{"role": "system", "content": "Be brief."},
                                              {"role": "user",
                                               "content": "<image><image>And this?"}])"));
  EXPECT_EQ(prompts[1].images, (std::vector<std::filesystem::path>{"a.png", "b.png"}));

  const std::vector<Prompt> raw = PromptsFromTexts({"Once upon"}, {}, "", true);
  EXPECT_TRUE(raw[0].messages.is_null());
  EXPECT_EQ(raw[0].text, "Once upon");
}

TEST(GenerationPromptsTest, AFileLineGivesItsConversationAndImagesBesideTheFile) {
  testing::TempDir tmp;
  const auto file = tmp.Write("prompts/in.jsonl",
                              "{\"prompt\": \"What digit?\", \"images\": [\"d/7.png\"]}\n"
                              "\n"
                              "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n");
  const StatusOr<std::vector<Prompt>> prompts = ReadPromptFile(file, /*raw=*/false);
  ASSERT_TRUE(prompts.ok()) << prompts.status().message();
  ASSERT_EQ(prompts->size(), 2u);
  EXPECT_EQ((*prompts)[0].messages[0]["content"], "<image>What digit?");
  EXPECT_EQ((*prompts)[0].images[0], tmp.path() / "prompts" / "d/7.png");
  EXPECT_EQ((*prompts)[1].origin, file.string() + ":3");
  EXPECT_EQ((*prompts)[1].messages[0]["content"], "Hi");
}

TEST(GenerationPromptsTest, BadLinesAreRefusedNamingTheFileAndLine) {
  testing::TempDir tmp;
  const auto not_json = tmp.Write("a.jsonl", "{\"prompt\": \"ok\"}\nnot json\n");
  EXPECT_THAT(
      ReadPromptFile(not_json, false).status().message(),
      HasSubstr(not_json.string() + ":2: expected a JSON object with \"messages\" or \"prompt\""));
  const auto image = tmp.Write("b.jsonl", "{\"prompt\": \"x\", \"image\": \"7.png\"}\n");
  EXPECT_THAT(ReadPromptFile(image, /*raw=*/true).status().message(),
              HasSubstr(image.string() + ":1: images need the chat template (no --raw)"));
  const auto number = tmp.Write("c.jsonl", "{\"prompt\": 7}\n");
  EXPECT_THAT(ReadPromptFile(number, false).status().message(),
              HasSubstr(number.string() + ":1: \"prompt\" must be a string"));
  // A video is refused, not dropped from the prompt.
  const auto video = tmp.Write(
      "d.jsonl", "{\"prompt\": \"x\"}\n{\"prompt\": \"<video>x\", \"videos\": [\"clip/\"]}\n");
  EXPECT_THAT(ReadPromptFile(video, false).status().message(),
              HasSubstr(video.string() + ":2: \"videos\": engine generate reads images, not "
                                         "videos, in prompts"));
  EXPECT_THAT(ReadPromptFile(tmp.path() / "missing.jsonl", false).status().message(),
              HasSubstr("--input: cannot open '" + (tmp.path() / "missing.jsonl").string() + "'"));
}

}  // namespace
}  // namespace engine
