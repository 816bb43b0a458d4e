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

TEST(GenerationPromptsTest, VideosAreDirectoriesOrFrameListsBesideTheFileShownAfterTheImages) {
  testing::TempDir tmp;
  const auto file = tmp.Write(
      "prompts/in.jsonl",
      R"({"prompt": "Same?", "images": ["a.png"], "videos": ["clip/", ["f/1.png", "f/2.png"]], )"
      R"("fps": 4})"
      "\n");
  const StatusOr<std::vector<Prompt>> prompts = ReadPromptFile(file, /*raw=*/false);
  ASSERT_TRUE(prompts.ok()) << prompts.status().message();
  const Prompt& prompt = (*prompts)[0];
  EXPECT_EQ(prompt.messages[0]["content"], "<image><video><video>Same?");
  ASSERT_EQ(prompt.videos.size(), 2u);
  EXPECT_EQ(prompt.videos[0], std::vector<std::filesystem::path>{tmp.path() / "prompts/clip/"});
  EXPECT_EQ(prompt.videos[1], (std::vector<std::filesystem::path>{tmp.path() / "prompts/f/1.png",
                                                                  tmp.path() / "prompts/f/2.png"}));
  EXPECT_EQ(prompt.fps, 4);
}

TEST(GenerationPromptsTest, BadLinesAreRefusedNamingTheFileAndLine) {
  testing::TempDir tmp;
  const auto not_json = tmp.Write("a.jsonl", "{\"prompt\": \"ok\"}\nnot json\n");
  EXPECT_THAT(
      ReadPromptFile(not_json, false).status().message(),
      HasSubstr(not_json.string() + ":2: expected a JSON object with \"messages\" or \"prompt\""));
  const auto image = tmp.Write("b.jsonl", "{\"prompt\": \"x\", \"image\": \"7.png\"}\n");
  EXPECT_THAT(
      ReadPromptFile(image, /*raw=*/true).status().message(),
      HasSubstr(image.string() + ":1: images and videos need the chat template (no --raw)"));
  const auto number = tmp.Write("c.jsonl", "{\"prompt\": 7}\n");
  EXPECT_THAT(ReadPromptFile(number, false).status().message(),
              HasSubstr(number.string() + ":1: \"prompt\" must be a string"));
  const auto video =
      tmp.Write("d.jsonl", "{\"prompt\": \"x\"}\n{\"prompt\": \"x\", \"videos\": [1]}\n");
  EXPECT_THAT(ReadPromptFile(video, false).status().message(),
              HasSubstr(video.string() + ":2: 'videos' must hold videos"));
  const auto raw_video = tmp.Write("e.jsonl", "{\"prompt\": \"x\", \"video\": \"clip\"}\n");
  EXPECT_THAT(ReadPromptFile(raw_video, /*raw=*/true).status().message(),
              HasSubstr(raw_video.string() + ":1: images and videos need the chat template"));
  const auto fps = tmp.Write("f.jsonl", "{\"prompt\": \"x\", \"video\": \"clip\", \"fps\": 0}\n");
  EXPECT_THAT(ReadPromptFile(fps, false).status().message(),
              HasSubstr(fps.string() + ":1: \"fps\" must be a number above 0"));
  EXPECT_THAT(ReadPromptFile(tmp.path() / "missing.jsonl", false).status().message(),
              HasSubstr("--input: cannot open '" + (tmp.path() / "missing.jsonl").string() + "'"));
}

}  // namespace
}  // namespace engine
