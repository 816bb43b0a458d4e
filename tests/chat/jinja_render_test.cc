// The Jinja interpreter against Python Jinja2's behaviour in transformers' environment: the
// expected strings and messages are what jinja2 3.1 (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, transformers' tojson) renders.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "jinja/template.h"

namespace engine::jinja {
namespace {

std::string Render(const std::string& source, const nlohmann::ordered_json& variables = {}) {
  StatusOr<Template> t = Template::Parse(source, "t.jinja");
  if (!t.ok()) return "PARSE ERROR " + t.status().message();
  ValueDict vars;
  for (const auto& [key, value] : variables.items()) vars.emplace_back(key, Value::FromJson(value));
  StatusOr<RenderOutput> out = t->Render(std::move(vars));
  if (!out.ok()) return "ERROR " + out.status().message();
  return out->text;
}

TEST(JinjaRenderTest, PrintsLikePython) {
  EXPECT_EQ(Render("{{ [1,'a',none,true,1.5,{'k':'v'}] }}|{{ (1,2) }}|{{ 1e-5 }}|{{ 1e16 }}|"
                   "{{ 3/2 }}|{{ 4/2 }}"),
            "[1, 'a', None, True, 1.5, {'k': 'v'}]|(1, 2)|1e-05|1e+16|1.5|2.0");
}

}  // namespace
}  // namespace engine::jinja
