// A Jinja template as Hugging Face chat templates are written: parsed once, rendered with
// variables, byte for byte as Python Jinja2 renders it in transformers' environment
// (trim_blocks, lstrip_blocks, no trailing newline kept, transformers' tojson, raise_exception
// and strftime_now, the {% generation %} tag, loop controls).
//
//   ENGINE_ASSIGN_OR_RETURN(Template t, Template::Parse(text, "Qwen3-0.6B/chat_template.jinja"));
//   ENGINE_ASSIGN_OR_RETURN(RenderOutput out, t.Render({{"messages", messages}}));
//
// What it supports and how it differs from Jinja2 is listed in README.md ("Chat templates").
// Anything a template uses that is not supported is an error, never a guess.
//
// Failure: every error is "NAME:LINE:COL: message", NAME being the name the template was parsed
// with; a raise_exception() call reads "NAME:LINE:COL: the template raised an error: MESSAGE",
// followed by " (at ITEM)" when RenderHooks could name the loop item being rendered.
//
// Thread safety: a parsed Template is immutable; Render may run on several threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "engine/status.h"
#include "jinja/ast.h"
#include "jinja/evaluator.h"
#include "jinja/value.h"

namespace engine::jinja {

class Template {
 public:
  static StatusOr<Template> Parse(std::string_view source, std::string name);

  StatusOr<RenderOutput> Render(ValueDict variables, const RenderHooks& hooks = {}) const;

  const std::string& name() const { return name_; }
  // Whether the template marks assistant output with {% generation %} blocks.
  bool has_generation_blocks() const { return has_generation_blocks_; }

 private:
  std::string name_;
  std::shared_ptr<const Body> body_;
  bool has_generation_blocks_ = false;
};

}  // namespace engine::jinja
