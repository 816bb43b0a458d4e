#include "jinja/evaluator.h"

#include <chrono>

#include "jinja/builtins.h"
#include "jinja/globals.h"
#include "jinja/limits.h"

namespace engine::jinja {

Evaluator::Evaluator(const RenderHooks& hooks, ValueDict variables) : hooks_(hooks) {
  auto globals = std::make_shared<Frame>();
  for (auto& [name, value] : MakeGlobals()) (*globals)[name] = std::move(value);
  for (auto& [name, value] : variables) (*globals)[name] = std::move(value);
  scope_.push_back(std::move(globals));
  // Template-level `set`s go to a frame of their own above the globals, as in Jinja2's context.
  scope_.push_back(std::make_shared<Frame>());
}

StatusOr<RenderOutput> Evaluator::Render(const Body& body) {
  RenderBudget budget;
  RenderOutput output;
  out_ = &output.text;
  try {
    Execute(body);
  } catch (const std::bad_alloc&) {
    // A safety net under the budgets: memory ran out while this template rendered.
    return InvalidArgumentError(std::to_string(line_) + ":" + std::to_string(column_) +
                                ": the template ran out of memory");
  } catch (const EvalError& error) {
    std::string message = std::to_string(error.line > 0 ? error.line : line_) + ":" +
                          std::to_string(error.line > 0 ? error.column : column_) + ": " +
                          error.message;
    if (!error.context.empty()) message += " (at " + error.context + ")";
    return InvalidArgumentError(message);
  }
  output.generation_spans = std::move(generation_spans_);
  return output;
}

void Evaluator::Write(const std::string& text) {
  RenderBudget::CheckString(out_->size() + text.size());
  *out_ += text;
}

void Evaluator::Execute(const Body& body) {
  for (const auto& node : body) ExecuteNode(*node);
}

void Evaluator::ExecuteNode(const Node& node) {
  At(node.line, node.column);
  try {
    switch (node.kind) {
      case Node::Kind::kText:
        Write(node.text);
        return;
      case Node::Kind::kOutput:
        Write(Eval(*node.expr).Str());
        return;
      case Node::Kind::kIf:
        for (const auto& [test, body] : node.branches) {
          if (test == nullptr || Eval(*test).Truthy()) {
            Execute(body);
            return;
          }
        }
        return;
      case Node::Kind::kFor:
        ExecuteFor(node);
        return;
      case Node::Kind::kSet:
      case Node::Kind::kSetBlock:
        ExecuteSet(node);
        return;
      case Node::Kind::kMacro:
        ExecuteMacro(node);
        return;
      case Node::Kind::kCallBlock:
        ExecuteCallBlock(node);
        return;
      case Node::Kind::kFilterBlock: {
        Value text = Value::String(Capture(node.body));
        for (const auto& filter : node.filters) text = EvalFilter(*filter, text);
        Write(text.Str());
        return;
      }
      case Node::Kind::kBreak:
        throw BreakSignal{};
      case Node::Kind::kContinue:
        throw ContinueSignal{};
      case Node::Kind::kGeneration: {
        size_t begin = out_->size();
        Execute(node.body);
        if (!capturing_) generation_spans_.emplace_back(begin, out_->size());
        return;
      }
    }
  } catch (EvalError& error) {
    if (error.line == 0) {
      error.line = line_;
      error.column = column_;
    }
    throw;
  }
}

// Jinja's for loop as one piece (the item filter, the loop variable's attributes, tuple unpacking,
// break/continue, the else branch): its parts share the loop's state.
void Evaluator::ExecuteFor(const Node& node) {
  ValueList items = Iterate(Eval(*node.expr));
  At(node.line, node.column);
  std::vector<size_t> selected;
  if (node.condition != nullptr) {
    // `for x in xs if cond`: the condition sees the loop variable, and loop.* counts only the
    // items it keeps.
    for (size_t i = 0; i < items.size(); ++i) {
      RenderBudget::ChargeWork(1);
      scope_.push_back(std::make_shared<Frame>());
      Assign(*node.target, items[i]);
      bool keep = Eval(*node.condition).Truthy();
      scope_.pop_back();
      if (keep) selected.push_back(i);
    }
  } else {
    for (size_t i = 0; i < items.size(); ++i) selected.push_back(i);
  }
  const size_t n = selected.size();
  for (size_t k = 0; k < n; ++k) {
    RenderBudget::ChargeWork(1);
    const Value& item = items[selected[k]];
    auto frame = std::make_shared<Frame>();
    const int64_t index = static_cast<int64_t>(k);
    const int64_t length = static_cast<int64_t>(n);
    ValueDict loop = {
        {"index", Value::Int(index + 1)},
        {"index0", Value::Int(index)},
        {"revindex", Value::Int(length - index)},
        {"revindex0", Value::Int(length - index - 1)},
        {"first", Value::Bool(k == 0)},
        {"last", Value::Bool(k + 1 == n)},
        {"length", Value::Int(length)},
        {"previtem",
         k > 0 ? items[selected[k - 1]] : Value::Undefined("there is no previous item")},
        {"nextitem",
         k + 1 < n ? items[selected[k + 1]] : Value::Undefined("there is no next item")},
        {"depth", Value::Int(1)},
        {"depth0", Value::Int(0)},
        {"cycle", Value::Callable("loop.cycle",
                                  [k](CallArgs& args, Evaluator&) -> StatusOr<Value> {
                                    if (args.positional.empty()) {
                                      return InvalidArgumentError("no items for cycling given");
                                    }
                                    return args.positional[k % args.positional.size()];
                                  })},
    };
    (*frame)["loop"] = Value::Dict(std::move(loop));
    scope_.push_back(frame);
    loop_items_.push_back(&item);
    try {
      Assign(*node.target, item);
      Execute(node.body);
    } catch (const BreakSignal&) {
      loop_items_.pop_back();
      scope_.pop_back();
      break;
    } catch (const ContinueSignal&) {
    } catch (EvalError& error) {
      if (error.context.empty() && hooks_.describe_loop_item) {
        if (auto description = hooks_.describe_loop_item(item)) error.context = *description;
      }
      loop_items_.pop_back();
      scope_.pop_back();
      throw;
    }
    loop_items_.pop_back();
    scope_.pop_back();
  }
  if (n == 0) Execute(node.else_body);
}

void Evaluator::Assign(const Expr& target, const Value& value) {
  if (target.kind == Expr::Kind::kName) {
    (*scope_.back())[target.name] = value;
    return;
  }
  if (target.kind == Expr::Kind::kGetAttr) {
    At(target.line, target.column);
    Value object = Lookup(target.a->name);
    if (!object.is_namespace()) ThrowError("cannot assign attribute on non-namespace object");
    ValueDict& items = object.namespace_items();
    for (auto& [key, existing] : items) {
      if (key == target.name) {
        existing = value;
        return;
      }
    }
    items.emplace_back(target.name, value);
    return;
  }
  // A tuple of names.
  ValueList values = Iterate(value);
  if (values.size() != target.items.size()) {
    At(target.line, target.column);
    ThrowError(
        values.size() < target.items.size()
            ? "not enough values to unpack (expected " + std::to_string(target.items.size()) +
                  ", got " + std::to_string(values.size()) + ")"
            : "too many values to unpack (expected " + std::to_string(target.items.size()) + ")");
  }
  for (size_t i = 0; i < values.size(); ++i) Assign(*target.items[i], values[i]);
}

void Evaluator::ExecuteSet(const Node& node) {
  if (node.kind == Node::Kind::kSet) {
    Value value = Eval(*node.expr);
    Assign(*node.target, value);
    return;
  }
  Value value = Value::String(Capture(node.body));
  for (const auto& filter : node.filters) value = EvalFilter(*filter, value);
  Assign(*node.target, value);
}

std::string Evaluator::Capture(const Body& body) {
  std::string text;
  std::string* saved = out_;
  bool saved_capturing = capturing_;
  out_ = &text;
  capturing_ = true;
  try {
    Execute(body);
  } catch (...) {
    out_ = saved;
    capturing_ = saved_capturing;
    throw;
  }
  out_ = saved;
  capturing_ = saved_capturing;
  return text;
}

Value Evaluator::MakeMacro(const std::string& name, const KeywordArgs* params, const Body* body,
                           Scope scope) {
  return Value::Callable(
      name, [params, body, scope](CallArgs& args, Evaluator& self) -> StatusOr<Value> {
        auto frame = std::make_shared<Frame>();
        if (self.pending_caller_) {
          (*frame)["caller"] = *self.pending_caller_;
          self.pending_caller_.reset();
        }
        ValueList varargs;
        for (size_t i = 0; i < args.positional.size(); ++i) {
          if (i < params->size()) {
            (*frame)[(*params)[i].first] = args.positional[i];
          } else {
            varargs.push_back(args.positional[i]);
          }
        }
        ValueDict kwargs;
        for (const auto& [key, value] : args.keyword) {
          bool is_param = false;
          for (const auto& param : *params) is_param = is_param || param.first == key;
          if (is_param) {
            (*frame)[key] = value;
          } else {
            kwargs.emplace_back(key, value);
          }
        }
        (*frame)["varargs"] = Value::List(std::move(varargs));
        (*frame)["kwargs"] = Value::Dict(std::move(kwargs));
        Scope saved = std::move(self.scope_);
        self.scope_ = scope;
        self.scope_.push_back(frame);
        try {
          // Defaults are evaluated in the macro's scope, after the arguments are bound.
          for (const auto& [param, default_value] : *params) {
            if (frame->count(param)) continue;
            (*frame)[param] = default_value != nullptr
                                  ? self.Eval(*default_value)
                                  : Value::Undefined("'" + param + "' is undefined");
          }
          std::string text = self.Capture(*body);
          self.scope_ = std::move(saved);
          return Value::String(std::move(text));
        } catch (...) {
          self.scope_ = std::move(saved);
          throw;
        }
      });
}

void Evaluator::ExecuteMacro(const Node& node) {
  (*scope_.back())[node.name] = MakeMacro(node.name, &node.params, &node.body, scope_);
}

void Evaluator::ExecuteCallBlock(const Node& node) {
  Value caller = MakeMacro("caller", &node.params, &node.body, scope_);
  const Expr& call = *node.expr;
  Value callee = Eval(*call.a);
  CallArgs args = EvalArgs(call);
  At(call.line, call.column);
  if (!callee.is_function()) ThrowError("'" + callee.TypeName() + "' is not callable");
  // The macro finds `caller` among its own variables.
  pending_caller_ = caller;
  Value result = Call(callee, args);
  pending_caller_.reset();
  Write(result.Str());
}

Value Evaluator::Lookup(const std::string& name) const {
  for (auto frame = scope_.rbegin(); frame != scope_.rend(); ++frame) {
    auto found = (*frame)->find(name);
    if (found != (*frame)->end()) return found->second;
  }
  return Value::Undefined("'" + name + "' is undefined");
}

Value Evaluator::Call(const Value& callable, CallArgs& args) {
  if (callable.is_undefined()) RequireDefined(callable);
  if (!callable.is_function()) ThrowError("'" + callable.TypeName() + "' is not callable");
  RenderBudget::Call nested;
  StatusOr<Value> result = callable.function()(args, *this);
  if (!result.ok()) ThrowError(result.status().message());
  return std::move(result).value();
}

Value Evaluator::Filter(const std::string& name, const Value& operand, CallArgs& args) {
  return ApplyFilter(name, operand, args, *this);
}

bool Evaluator::Test(const std::string& name, const Value& operand, CallArgs& args) {
  return ApplyTest(name, operand, args, *this);
}

CallArgs Evaluator::EvalArgs(const Expr& expr) {
  CallArgs args;
  for (const auto& item : expr.items) args.positional.push_back(Eval(*item));
  for (const auto& [name, value] : expr.kwargs) args.keyword.emplace_back(name, Eval(*value));
  return args;
}

Value Evaluator::EvalFilter(const Expr& expr, const Value& operand) {
  CallArgs args = EvalArgs(expr);
  At(expr.line, expr.column);
  return ApplyFilter(expr.name, operand, args, *this);
}

Value Evaluator::EvalCall(const Expr& expr) {
  Value callee = Eval(*expr.a);
  CallArgs args = EvalArgs(expr);
  At(expr.line, expr.column);
  return Call(callee, args);
}

Value Evaluator::EvalCompare(const Expr& expr) {
  Value left = Eval(*expr.items[0]);
  for (size_t i = 0; i < expr.ops.size(); ++i) {
    Value right = Eval(*expr.items[i + 1]);
    At(expr.line, expr.column);
    const std::string& op = expr.ops[i];
    bool result;
    if (op == "==") {
      result = left == right;
    } else if (op == "!=") {
      result = left != right;
    } else if (op == "in") {
      result = Contains(right, left);
    } else if (op == "notin") {
      result = !Contains(right, left);
    } else {
      result = Compare(op, left, right);
    }
    if (!result) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

// One case per expression kind, each short; long because the grammar has that many kinds, and one
// switch keeps the language's semantics in one place.
Value Evaluator::Eval(const Expr& expr) {
  switch (expr.kind) {
    case Expr::Kind::kLiteral:
      return expr.literal;
    case Expr::Kind::kName:
      return Lookup(expr.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      ValueList items;
      for (const auto& item : expr.items) items.push_back(Eval(*item));
      return Value::List(std::move(items), expr.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      ValueDict items;
      for (size_t i = 0; i + 1 < expr.items.size(); i += 2) {
        Value key = Eval(*expr.items[i]);
        Value value = Eval(*expr.items[i + 1]);
        At(expr.items[i]->line, expr.items[i]->column);
        if (!key.is_string()) ThrowError("dict keys must be strings, got " + key.TypeName());
        bool replaced = false;
        for (auto& [k, v] : items) {
          if (k == key.as_string()) {
            v = value;
            replaced = true;
          }
        }
        if (!replaced) items.emplace_back(key.as_string(), value);
      }
      return Value::Dict(std::move(items));
    }
    case Expr::Kind::kGetAttr: {
      Value object = Eval(*expr.a);
      At(expr.line, expr.column);
      return GetAttribute(object, expr.name);
    }
    case Expr::Kind::kGetItem: {
      Value object = Eval(*expr.a);
      Value key = Eval(*expr.b);
      At(expr.line, expr.column);
      return GetItem(object, key);
    }
    case Expr::Kind::kSlice: {
      Value object = Eval(*expr.a);
      Value parts[3];
      for (size_t i = 0; i < 3; ++i) {
        parts[i] = expr.items[i] != nullptr ? Eval(*expr.items[i]) : Value::None();
      }
      At(expr.line, expr.column);
      return Slice(object, parts[0], parts[1], parts[2]);
    }
    case Expr::Kind::kCall:
      return EvalCall(expr);
    case Expr::Kind::kFilter:
      return EvalFilter(expr, Eval(*expr.a));
    case Expr::Kind::kTest: {
      Value operand = Eval(*expr.a);
      CallArgs args = EvalArgs(expr);
      At(expr.line, expr.column);
      return Value::Bool(ApplyTest(expr.name, operand, args, *this) != expr.negated);
    }
    case Expr::Kind::kUnary: {
      Value operand = Eval(*expr.a);
      At(expr.line, expr.column);
      return BinaryOperation(expr.name == "-" ? "neg" : "pos", operand, Value());
    }
    case Expr::Kind::kBinary: {
      Value a = Eval(*expr.a);
      Value b = Eval(*expr.b);
      At(expr.line, expr.column);
      if (expr.name == "~") {
        std::string left = a.Str(), right = b.Str();
        RenderBudget::Built(left.size() + right.size());
        return Value::String(left + right);
      }
      return BinaryOperation(expr.name, a, b);
    }
    case Expr::Kind::kCompare:
      return EvalCompare(expr);
    case Expr::Kind::kAnd: {
      Value a = Eval(*expr.a);
      return a.Truthy() ? Eval(*expr.b) : a;
    }
    case Expr::Kind::kOr: {
      Value a = Eval(*expr.a);
      return a.Truthy() ? a : Eval(*expr.b);
    }
    case Expr::Kind::kNot:
      return Value::Bool(!Eval(*expr.a).Truthy());
    case Expr::Kind::kCondition:
      if (Eval(*expr.b).Truthy()) return Eval(*expr.a);
      if (expr.c != nullptr) return Eval(*expr.c);
      return Value::Undefined("the inline if-expression on line " + std::to_string(expr.line) +
                              " evaluated to false and no else section was defined");
  }
  return Value();
}

}  // namespace engine::jinja
