// Renders a parsed template: runs its statements against variables and writes the output.
//
// Scoping follows Jinja2: `set` at the top level assigns template variables; each iteration of
// a `for` loop (and each macro call) has its own scope, so assignments inside are not seen after
// it, which is why templates carry state out of loops in namespace() objects. `if` opens no
// scope. Macros see the scopes they were defined in.
//
// One Evaluator renders once; it is not shared between threads. Errors inside are EvalError
// exceptions; Render turns them into a Status with the template position, and no exception
// leaves Render.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "jinja/ast.h"
#include "jinja/value.h"

namespace engine::jinja {

struct RenderHooks {
  // The local time strftime_now formats; the system clock when unset.
  std::function<std::tm()> now;
  // Names a loop item for error messages ("messages[2], role 'user'"), or nullopt when it is not
  // one the caller knows. An error inside loops names the innermost item described.
  std::function<std::optional<std::string>(const Value& item)> describe_loop_item;
};

struct RenderOutput {
  std::string text;
  // [begin, end) byte offsets in text of what each {% generation %} block rendered.
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

class Evaluator {
 public:
  Evaluator(const RenderHooks& hooks, ValueDict variables);

  // Renders `body`; errors come back as "line:col: message[ (at ITEM)]".
  StatusOr<RenderOutput> Render(const Body& body);

  // Calls a callable value (used by filters that take other callables, and by macros).
  Value Call(const Value& callable, CallArgs& args);
  // The filter/test machinery needs these to apply a filter or test by name.
  Value Filter(const std::string& name, const Value& operand, CallArgs& args);
  bool Test(const std::string& name, const Value& operand, CallArgs& args);
  const RenderHooks& hooks() const { return hooks_; }

 private:
  using Frame = std::unordered_map<std::string, Value>;
  using Scope = std::vector<std::shared_ptr<Frame>>;

  void Execute(const Body& body);
  void ExecuteNode(const Node& node);
  void ExecuteFor(const Node& node);
  void ExecuteSet(const Node& node);
  void ExecuteMacro(const Node& node);
  void ExecuteCallBlock(const Node& node);
  Value MakeMacro(const std::string& name, const KeywordArgs* params, const Body* body,
                  Scope scope);
  std::string Capture(const Body& body);
  void Assign(const Expr& target, const Value& value);

  Value Eval(const Expr& expr);
  Value EvalCompare(const Expr& expr);
  Value EvalCall(const Expr& expr);
  Value EvalFilter(const Expr& expr, const Value& operand);
  CallArgs EvalArgs(const Expr& expr);
  Value Lookup(const std::string& name) const;
  // Appends to the output (or the capture), within the render's string budget.
  void Write(const std::string& text);
  void At(int line, int column) {
    line_ = line;
    column_ = column;
  }

  const RenderHooks& hooks_;
  Scope scope_;
  std::string* out_ = nullptr;
  bool capturing_ = false;
  std::vector<std::pair<size_t, size_t>> generation_spans_;
  std::vector<const Value*> loop_items_;
  std::optional<Value> pending_caller_;  // set by a call block for the macro it calls
  int line_ = 1;
  int column_ = 1;
};

// Break and continue unwind to their loop as these.
struct BreakSignal {};
struct ContinueSignal {};

}  // namespace engine::jinja
