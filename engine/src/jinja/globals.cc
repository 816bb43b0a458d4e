#include "jinja/globals.h"

#include <chrono>
#include <ctime>

#include "jinja/evaluator.h"
#include "jinja/limits.h"

namespace engine::jinja {
namespace {

StatusOr<Value> Range(CallArgs& args, Evaluator&) {
  std::vector<int64_t> numbers;
  for (const Value& arg : args.positional) {
    if (!arg.is_int() && !arg.is_bool()) {
      return InvalidArgumentError("'" + arg.TypeName() +
                                  "' object cannot be interpreted as an integer");
    }
    numbers.push_back(arg.is_bool() ? arg.as_bool() : arg.as_int());
  }
  if (numbers.empty() || numbers.size() > 3 || !args.keyword.empty()) {
    return InvalidArgumentError("range expected 1 to 3 integer arguments");
  }
  int64_t start = numbers.size() == 1 ? 0 : numbers[0];
  int64_t stop = numbers.size() == 1 ? numbers[0] : numbers[1];
  int64_t step = numbers.size() == 3 ? numbers[2] : 1;
  if (step == 0) return InvalidArgumentError("range() arg 3 must not be zero");
  ValueList items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    if (items.size() >= 100000) return InvalidArgumentError("range too big (100000 items at most)");
    items.push_back(Value::Int(i));
    if (__builtin_add_overflow(i, step, &i)) break;  // past the last int64: past stop too
  }
  RenderBudget::ChargeWork(static_cast<int64_t>(items.size()));
  return Value::List(std::move(items));
}

StatusOr<Value> Namespace(CallArgs& args, Evaluator&) {
  ValueDict items;
  auto put = [&items](const std::string& key, const Value& value) {
    for (auto& [k, v] : items) {
      if (k == key) {
        v = value;
        return;
      }
    }
    items.emplace_back(key, value);
  };
  if (args.positional.size() > 1) {
    return InvalidArgumentError("namespace() takes at most 1 positional argument");
  }
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (!source.is_dict()) return InvalidArgumentError("namespace() takes a dict");
    for (const auto& [key, value] : source.as_dict()) put(key, value);
  }
  for (const auto& [key, value] : args.keyword) put(key, value);
  return Value::Namespace(std::move(items));
}

StatusOr<Value> Dict(CallArgs& args, Evaluator&) {
  if (!args.positional.empty()) return InvalidArgumentError("dict() takes keyword arguments only");
  return Value::Dict(args.keyword);
}

StatusOr<Value> RaiseException(CallArgs& args, Evaluator&) {
  std::string message = args.positional.empty() ? "" : args.positional[0].Str();
  return InvalidArgumentError(kRaisedPrefix + message);
}

StatusOr<Value> StrftimeNow(CallArgs& args, Evaluator& evaluator) {
  const Value* format = args.Get(0, "format");
  if (format == nullptr || !format->is_string()) {
    return InvalidArgumentError("strftime_now() takes a format string");
  }
  std::tm now{};
  if (evaluator.hooks().now) {
    now = evaluator.hooks().now();
  } else {
    std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    localtime_r(&t, &now);
  }
  char buffer[512];
  size_t n = std::strftime(buffer, sizeof buffer, format->as_string().c_str(), &now);
  if (n == 0 && !format->as_string().empty()) {
    return InvalidArgumentError("strftime_now(): the formatted time is empty or too long");
  }
  return Value::String(std::string(buffer, n));
}

}  // namespace

ValueDict MakeGlobals() {
  return {
      {"range", Value::Callable("range", Range)},
      {"namespace", Value::Callable("namespace", Namespace)},
      {"dict", Value::Callable("dict", Dict)},
      {"raise_exception", Value::Callable("raise_exception", RaiseException)},
      {"strftime_now", Value::Callable("strftime_now", StrftimeNow)},
  };
}

}  // namespace engine::jinja
