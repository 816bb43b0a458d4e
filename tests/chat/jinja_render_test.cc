// The Jinja interpreter against Python Jinja2 in transformers' environment: every snippet of
// tests/fixtures/chat_templates/jinja_features.json (written by jinja_features.py with
// transformers' environment) renders the same text; constructs we do not support, and template
// errors, are errors naming the template, line and column.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "jinja/template.h"

namespace engine::jinja {
namespace {

std::string Render(const std::string& source, const nlohmann::ordered_json& variables = {}) {
  StatusOr<Template> t = Template::Parse(source, "t.jinja");
  if (!t.ok()) return "ERROR " + t.status().message();
  ValueDict vars;
  for (const auto& [key, value] : variables.items()) vars.emplace_back(key, Value::FromJson(value));
  StatusOr<RenderOutput> out = t->Render(std::move(vars));
  if (!out.ok()) return "ERROR " + out.status().message();
  return out->text;
}

TEST(JinjaRenderTest, EveryFeatureSnippetRendersAsJinja2) {
  std::ifstream in(std::filesystem::path(ENGINE_CHAT_TEMPLATE_FIXTURES) / "jinja_features.json");
  nlohmann::ordered_json snippets = nlohmann::ordered_json::parse(in);
  ASSERT_GE(snippets.size(), 30u);
  for (const auto& snippet : snippets) {
    std::string source = snippet["template"].get<std::string>();
    SCOPED_TRACE(source);
    ASSERT_TRUE(snippet.contains("text")) << snippet["error"];
    EXPECT_EQ(Render(source, snippet["variables"]), snippet["text"].get<std::string>());
  }
}

TEST(JinjaRenderTest, PrintsValuesAsPythonDoes) {
  EXPECT_EQ(Render("{{ [1,'a',none,true,1.5,{'k':'v'}] }}|{{ (1,2) }}|{{ (1,) }}|{{ 1e-5 }}|"
                   "{{ 1e16 }}|{{ 3/2 }}|{{ 4/2 }}|{{ [\"it's\"] }}"),
            "[1, 'a', None, True, 1.5, {'k': 'v'}]|(1, 2)|(1,)|1e-05|1e+16|1.5|2.0|[\"it's\"]");
}

TEST(JinjaRenderTest, GenerationBlocksRenderTheirBodyAndRecordWhere) {
  StatusOr<Template> t = Template::Parse(
      "{% for m in messages %}<{{ m }}>{% generation %}{{ m | upper }}!{% endgeneration %}"
      "{% endfor %}",
      "t.jinja");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(t->has_generation_blocks());
  StatusOr<RenderOutput> out =
      t->Render({{"messages", Value::List({Value::String("a"), Value::String("bc")})}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->text, "<a>A!<bc>BC!");
  EXPECT_EQ(out->generation_spans, (std::vector<std::pair<size_t, size_t>>{{3, 5}, {9, 12}}));
}

TEST(JinjaRenderTest, UnsupportedConstructsAreErrorsAtTheirPosition) {
  EXPECT_EQ(Render("{% extends 'base.jinja' %}"),
            "ERROR t.jinja:1:4: the 'extends' tag is not supported in chat templates");
  EXPECT_EQ(Render("{% include 'x' %}"),
            "ERROR t.jinja:1:4: the 'include' tag is not supported in chat templates");
  EXPECT_EQ(Render("line one\n{{ messages | nofilter }}"),
            "ERROR t.jinja:2:15: no filter named 'nofilter'");
  EXPECT_EQ(Render("{% if x is palindrome %}{% endif %}"),
            "ERROR t.jinja:1:12: no test named 'palindrome'");
  EXPECT_EQ(Render("{% for x in xs recursive %}{% endfor %}"),
            "ERROR t.jinja:1:16: recursive for loops are not supported");
  EXPECT_EQ(Render("{% frobnicate %}"), "ERROR t.jinja:1:4: unknown tag 'frobnicate'");
  EXPECT_EQ(Render("{{ f(*args) }}"),
            "ERROR t.jinja:1:6: argument unpacking (* and **) is not supported");
}

TEST(JinjaRenderTest, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(Render("{% for m in messages %}\n{{ m }}"),
            "ERROR t.jinja:2:8: unexpected end of template, expected 'else' or 'endfor'");
  EXPECT_EQ(Render("{% if x %}a{% endfor %}"),
            "ERROR t.jinja:1:15: unexpected 'endfor', expected 'elif' or 'else' or 'endif'");
  EXPECT_EQ(Render("{% endif %}"), "ERROR t.jinja:1:4: unexpected 'endif': no open block to close");
  EXPECT_EQ(Render("ab\n  {{ 'open }}"), "ERROR t.jinja:2:6: unterminated string");
  EXPECT_EQ(Render("{{ x "), "ERROR t.jinja:1:1: unterminated tag: no '}}'");
  EXPECT_EQ(Render("{# never closed"), "ERROR t.jinja:1:1: unterminated comment: no '#}'");
  EXPECT_EQ(Render("{{ 1 + }}"), "ERROR t.jinja:1:8: unexpected '}}'");
  EXPECT_EQ(Render("{{ a ? b }}"), "ERROR t.jinja:1:6: unexpected character '?'");
  EXPECT_EQ(Render("{% break %}"), "ERROR t.jinja:1:4: 'break' outside a for loop");
}

TEST(JinjaRenderTest, RuntimeErrorsArePythonsAtTheirPosition) {
  EXPECT_EQ(Render("{{ x.y }}"), "ERROR t.jinja:1:5: 'x' is undefined");
  EXPECT_EQ(Render("{{ m.content.foo.bar }}", {{"m", {{"content", "x"}}}}),
            "ERROR t.jinja:1:17: 'str object' has no attribute 'foo'");
  EXPECT_EQ(Render("{{ m.tool_calls[0] }}", {{"m", {{"content", "x"}}}}),
            "ERROR t.jinja:1:16: 'dict object' has no attribute 'tool_calls'");
  EXPECT_EQ(Render("{{ 'a' + 1 }}"),
            "ERROR t.jinja:1:8: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(Render("{{ 1 < 'a' }}"),
            "ERROR t.jinja:1:4: '<' not supported between instances of 'int' and 'str'");
  EXPECT_EQ(Render("{{ xs.append(1) }}", {{"xs", nlohmann::ordered_json::array()}}),
            "ERROR t.jinja:1:6: access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(Render("{{ 1 // 0 }}"), "ERROR t.jinja:1:6: integer division or modulo by zero");
  EXPECT_EQ(Render("{{ u | tojson }}"),
            "ERROR t.jinja:1:8: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(Render("{% set x = 1 %}{% set x.a = 2 %}"),
            "ERROR t.jinja:1:23: cannot assign attribute on non-namespace object");
  EXPECT_EQ(Render("{{ 'abc'.split('') }}"), "ERROR t.jinja:1:15: empty separator");
  EXPECT_EQ(Render("first\n{%- if true %}\n  {{ raise_exception('Only user and assistant roles') }}"
                   "\n{% endif %}"),
            "ERROR t.jinja:3:21: the template raised an error: Only user and assistant roles");
}

TEST(JinjaRenderTest, WhitespaceControlAsTransformersConfiguresJinja) {
  // trim_blocks: the newline after a block tag or comment goes; lstrip_blocks: indentation
  // before it goes; neither applies to {{ }}; a final newline of the template is dropped; "\r\n"
  // in text becomes "\n". (Expected strings are jinja2's.)
  EXPECT_EQ(Render("{% for i in [1, 2] %}\n    {{ i }}\n{% endfor %}\n"), "    1\n    2\n");
  EXPECT_EQ(Render("  {{ 'a' }}  \n  {%- if true -%}  b  {%- endif %}\n"), "  ab");
  EXPECT_EQ(Render("x {%+ if true %}y{% endif %}"), "x y");
  EXPECT_EQ(Render("a\r\nb {# c #}\r\nd\n\n"), "a\nb d\n");
}

}  // namespace
}  // namespace engine::jinja
