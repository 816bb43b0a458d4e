#include "jinja/template.h"

#include "jinja/lexer.h"
#include "jinja/parser.h"

namespace engine::jinja {
namespace {

// "NAME:LINE:COL: message" from the lexer's, parser's or evaluator's "LINE:COL: message".
Status Located(const std::string& name, const Status& status) {
  return Status(status.code(), name + ":" + status.message());
}

bool HasGeneration(const Body& body) {
  for (const auto& node : body) {
    if (node->kind == Node::Kind::kGeneration) return true;
    if (HasGeneration(node->body) || HasGeneration(node->else_body)) return true;
    for (const auto& branch : node->branches) {
      if (HasGeneration(branch.second)) return true;
    }
  }
  return false;
}

}  // namespace

StatusOr<Template> Template::Parse(std::string_view source, std::string name) {
  StatusOr<std::vector<Token>> tokens = Tokenize(source);
  if (!tokens.ok()) return Located(name, tokens.status());
  StatusOr<Body> body = jinja::Parse(*tokens);
  if (!body.ok()) return Located(name, body.status());
  Template t;
  t.name_ = std::move(name);
  t.has_generation_blocks_ = HasGeneration(*body);
  t.body_ = std::make_shared<const Body>(std::move(body).value());
  return t;
}

StatusOr<RenderOutput> Template::Render(ValueDict variables, const RenderHooks& hooks) const {
  Evaluator evaluator(hooks, std::move(variables));
  StatusOr<RenderOutput> output = evaluator.Render(*body_);
  if (!output.ok()) return Located(name_, output.status());
  return output;
}

}  // namespace engine::jinja
