// Every committed chat template (tests/fixtures/chat_templates/*.jinja) renders every
// conversation of conversations.json, with and without a generation prompt, exactly as
// transformers' apply_chat_template renders it (tests/reference/render_chat_template.py runs
// transformers itself, from the project's Python environment). A template that raises for a
// conversation must raise in both, with the same message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/chat_template.h"
#include "chat/reference_cases.h"
#include "jinja/globals.h"

namespace engine::chat {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Runs `command`, returning its standard output and exit status.
std::pair<std::string, int> RunCommand(const std::string& command) {
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {"", -1};
  std::array<char, 65536> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  int status = pclose(pipe);
  return {output, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// The cases and transformers' results, computed once for the test below.
class ChatTemplateReferenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cases_ = new std::vector<ReferenceCase>(ReferenceCases(ENGINE_CHAT_TEMPLATE_FIXTURES));
    ordered_json request = {{"cases", ordered_json::array()}};
    for (const ReferenceCase& c : *cases_) {
      request["cases"].push_back({{"template_file", c.template_file}, {"variables", c.variables}});
    }
    request_file_ = new fs::path(fs::temp_directory_path() /
                                 ("engine_chat_reference_" + std::to_string(getpid()) + ".json"));
    std::ofstream(*request_file_) << request.dump();
  }
  static void TearDownTestSuite() {
    fs::remove(*request_file_);
    delete request_file_;
    delete cases_;
  }

  // Runs `program` on the cases; fails the test when it cannot.
  static ordered_json RunReference(const std::string& program) {
    auto [output, status] = RunCommand(program + " '" + request_file_->string() + "'");
    EXPECT_EQ(status, 0) << program << " failed (scripts/setup.sh makes the project's Python "
                         << "environment, .venv):\n"
                         << output;
    if (status != 0) return ordered_json::array();
    ordered_json results = ordered_json::parse(output);
    EXPECT_EQ(results.size(), cases_->size());
    return results;
  }

  // One Python process for every case; where transformers is missing, its ImportError is on
  // the test's standard error.
  static ordered_json TransformersResults() {
    return RunReference("'" + std::string(ENGINE_PYTHON) + "' '" + ENGINE_REFERENCE_DIR +
                        "/render_chat_template.py'");
  }

  static StatusOr<std::string> Ours(const ReferenceCase& c) {
    StatusOr<ChatTemplate> chat_template =
        ChatTemplate::Parse(ReadFile(c.template_file), fs::path(c.template_file).filename());
    if (!chat_template.ok()) return chat_template.status();
    return chat_template->Render(c.messages, c.options);
  }

  static std::vector<ReferenceCase>* cases_;
  static fs::path* request_file_;
};

std::vector<ReferenceCase>* ChatTemplateReferenceTest::cases_ = nullptr;
fs::path* ChatTemplateReferenceTest::request_file_ = nullptr;

// Every case renders as transformers renders it, failures included (a template's raise_exception
// message is ours too).
TEST_F(ChatTemplateReferenceTest, EveryTemplateRendersEveryConversationAsTransformers) {
  ordered_json python = TransformersResults();
  ASSERT_EQ(python.size(), cases_->size());
  ASSERT_GE(cases_->size(), 300u);
  int rendered = 0;
  int raised = 0;
  for (size_t i = 0; i < cases_->size(); ++i) {
    const ReferenceCase& c = (*cases_)[i];
    SCOPED_TRACE(c.Describe());
    StatusOr<std::string> ours = Ours(c);
    if (python[i].contains("text")) {
      if (!ours.ok()) {
        ADD_FAILURE() << ours.status().message();
        continue;
      }
      EXPECT_EQ(*ours, python[i]["text"].get<std::string>());
      ++rendered;
      continue;
    }
    std::string expected = python[i]["error"].get<std::string>();
    if (ours.ok()) {
      ADD_FAILURE() << "transformers failed with: " << expected << "\nwe rendered:\n" << *ours;
      continue;
    }
    if (python[i]["raised"].get<bool>()) {
      EXPECT_THAT(ours.status().message(),
                  ::testing::HasSubstr(std::string(jinja::kRaisedPrefix) + expected));
      ++raised;
    } else {
      EXPECT_THAT(ours.status().message(),
                  ::testing::Not(::testing::HasSubstr(jinja::kRaisedPrefix)))
          << "transformers failed with: " << expected;
    }
  }
  // The fixtures exercise both outcomes: renders, and templates refusing conversations.
  EXPECT_GT(rendered, 250);
  EXPECT_GT(raised, 20);
}

}  // namespace
}  // namespace engine::chat
