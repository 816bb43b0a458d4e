// Every committed chat template (tests/fixtures/chat_templates/*.jinja) renders every
// conversation of conversations.json, with and without a generation prompt, exactly as
// @huggingface/jinja renders it (tests/reference_js/jinja, run under Node). A template that
// raises for a conversation must raise in both, with the same message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "chat/chat_template.h"
#include "chat/reference_cases.h"
#include "jinja/globals.h"

namespace engine::chat {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

// Where @huggingface/jinja 0.5.11 renders differently from Python Jinja2 on the fixtures, and
// why; in every case the test above checks that we render what jinja2 renders.
struct JavaScriptDivergence {
  std::string template_file;  // empty: every template
  std::string conversation;   // empty: every conversation
  std::string reason;
};

const std::vector<JavaScriptDivergence>& KnownJavaScriptDivergences() {
  static const auto* divergences = new std::vector<JavaScriptDivergence>{
      {"", "multimodal_parts",
       "a list of content parts given to a text-only template: Python fails to add a list to a "
       "str, or prints its repr(); JavaScript prints it as JSON"},
      {"Llama-3.2-11B-Vision-Instruct.jinja", "",
       "the template loops over message content; for a string, Python iterates its characters, "
       "JavaScript refuses"},
      {"Llama-2-7b-chat-hf.jinja", "empty_contents",
       "`system_message != false` with an empty system message: true in Python, false under "
       "JavaScript's loose comparison"},
      {"Meta-Llama-3-8B-Instruct.jinja", "tool_call",
       "`message['content'] | trim` on a message without content: Python trims str(undefined), "
       "\"\", JavaScript refuses"},
      {"Qwen2.5-VL-7B-Instruct.jinja", "tool_call",
       "a for loop over the content of a message without content: Python iterates nothing, "
       "JavaScript refuses"},
      {"SmolLM3-3B.jinja", "tool_call",
       "`tool | string` on a dict: Python prints its repr(), JavaScript has no such filter"},
  };
  return *divergences;
}

// Multimodal templates render a list of parts, and Llama 2's fails on it in both (it calls
// .strip() on the content); the other templates diverge on it.
bool IsKnownJavaScriptDivergence(const std::string& template_name,
                                 const std::string& conversation) {
  static const std::set<std::string> kMultimodal = {"Qwen2.5-VL-7B-Instruct.jinja",
                                                    "Llama-3.2-11B-Vision-Instruct.jinja",
                                                    "SmolLM3-3B.jinja",
                                                    "c4ai-command-r-v01.jinja",
                                                    "Qwen3-0.6B.jinja",
                                                    "Llama-2-7b-chat-hf.jinja"};
  for (const JavaScriptDivergence& d : KnownJavaScriptDivergences()) {
    bool template_matches = d.template_file.empty() ? !(d.conversation == "multimodal_parts" &&
                                                        kMultimodal.count(template_name) > 0)
                                                    : d.template_file == template_name;
    bool conversation_matches = d.conversation.empty() ? conversation != "multimodal_parts"
                                                       : d.conversation == conversation;
    if (template_matches && conversation_matches) return true;
  }
  return false;
}

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

// The cases and both references' results, computed once for the tests below.
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
    EXPECT_EQ(status, 0) << program << " failed:\n" << output;
    if (status != 0) return ordered_json::array();
    ordered_json results = ordered_json::parse(output);
    EXPECT_EQ(results.size(), cases_->size());
    return results;
  }

  static ordered_json JavaScriptResults() {
    const fs::path dir = ENGINE_REFERENCE_JINJA_DIR;
    if (RunCommand("command -v node >/dev/null 2>&1").second != 0) {
      ADD_FAILURE() << "node (Node.js) is not installed: the reference renderer "
                       "@huggingface/jinja runs under it. scripts/setup.sh installs Debian's "
                       "nodejs and npm.";
      return ordered_json::array();
    }
    if (!fs::exists(dir / "node_modules/@huggingface/jinja/package.json")) {
      ADD_FAILURE() << "@huggingface/jinja is not installed: run `npm ci` in " << dir
                    << " (scripts/setup.sh test does).";
      return ordered_json::array();
    }
    return RunReference("node '" + (dir / "render.mjs").string() + "'");
  }

  static ordered_json PythonResults() {
    if (RunCommand("/usr/bin/python3 -c 'import jinja2' >/dev/null 2>&1").second != 0) {
      ADD_FAILURE() << "Python's jinja2 is not installed for /usr/bin/python3: scripts/setup.sh "
                       "installs Debian's python3-jinja2.";
      return ordered_json::array();
    }
    return RunReference("/usr/bin/python3 '" + std::string(ENGINE_CHAT_TESTS_DIR) +
                        "/render_jinja2.py'");
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

// Python Jinja2 is what transformers renders with: every case matches it exactly, failures
// included (a template's raise_exception message is ours too).
TEST_F(ChatTemplateReferenceTest, EveryTemplateRendersEveryConversationAsPythonJinja2) {
  ordered_json python = PythonResults();
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
      ADD_FAILURE() << "jinja2 failed with: " << expected << "\nwe rendered:\n" << *ours;
      continue;
    }
    if (python[i]["raised"].get<bool>()) {
      EXPECT_THAT(ours.status().message(),
                  ::testing::HasSubstr(std::string(jinja::kRaisedPrefix) + expected));
      ++raised;
    } else {
      EXPECT_THAT(ours.status().message(),
                  ::testing::Not(::testing::HasSubstr(jinja::kRaisedPrefix)))
          << "jinja2 failed with: " << expected;
    }
  }
  // The fixtures exercise both outcomes: renders, and templates refusing conversations.
  EXPECT_GT(rendered, 250);
  EXPECT_GT(raised, 20);
}

// @huggingface/jinja renders every case as we do wherever it agrees with Python Jinja2; where it
// does not, Python is right (transformers uses it), and those cases are exactly these.
TEST_F(ChatTemplateReferenceTest, EveryTemplateRendersEveryConversationAsHuggingFaceJinja) {
  ordered_json javascript = JavaScriptResults();
  ordered_json python = PythonResults();
  ASSERT_EQ(javascript.size(), cases_->size());
  ASSERT_EQ(python.size(), cases_->size());
  std::vector<std::string> disagreements;
  int compared = 0;
  for (size_t i = 0; i < cases_->size(); ++i) {
    const ReferenceCase& c = (*cases_)[i];
    SCOPED_TRACE(c.Describe());
    bool js_ok = javascript[i].contains("text");
    bool py_ok = python[i].contains("text");
    if (js_ok != py_ok || (js_ok && javascript[i]["text"] != python[i]["text"])) {
      disagreements.push_back(c.Describe());
      continue;
    }
    StatusOr<std::string> ours = Ours(c);
    ++compared;
    if (js_ok) {
      ASSERT_TRUE(ours.ok()) << ours.status().message();
      EXPECT_EQ(*ours, javascript[i]["text"].get<std::string>());
    } else {
      EXPECT_FALSE(ours.ok());
    }
  }
  EXPECT_GT(compared, 300);
  std::vector<std::string> expected;
  for (const ReferenceCase& c : *cases_) {
    if (IsKnownJavaScriptDivergence(fs::path(c.template_file).filename(), c.conversation)) {
      expected.push_back(c.Describe());
    }
  }
  EXPECT_THAT(disagreements, ::testing::UnorderedElementsAreArray(expected));
}

}  // namespace
}  // namespace engine::chat
