// The budgets every template is parsed and rendered within. Chat templates come from a model hub
// and are run without being read, so a template that recurses without end, loops for ever or
// builds a string of gigabytes is an error naming its line and column and the limit, never a
// crash, a hang or memory exhausted. The limits sit far above what real templates use: the hub
// templates the chat tests render (tests/fixtures/chat_templates) nest a few levels deep, call
// macros a few levels deep and render a conversation in a few thousand steps.
//
// RenderBudget counts one render's work; Evaluator::Render makes it current for its thread, so
// that the operators and filters (free functions) charge it too. Thread-safe as one render is:
// each thread has its own current budget.
#pragma once

#include <cstddef>
#include <cstdint>

namespace engine::jinja {

// Parsing: grammar rules nested at most this deep (a block inside a block enters one more, a
// bracket or parenthesis about five: some fifty of them).
inline constexpr int kMaxNesting = 256;
// Rendering: calls (macros, call blocks, filters that call back) nested at most this deep, and
// values (lists, dicts, namespaces) printed or serialized at most this deep.
inline constexpr int kMaxCallDepth = 256;
// Rendering: loop iterations, range() items and items iterated by filters, all counted together.
inline constexpr int64_t kMaxWork = 10'000'000;
// Rendering: any string built (the output included) and any list built.
inline constexpr size_t kMaxStringBytes = size_t{64} << 20;
inline constexpr size_t kMaxListItems = size_t{1} << 22;

class RenderBudget {
 public:
  // Makes this budget current for the thread until it is destroyed.
  RenderBudget();
  ~RenderBudget();
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  // Each throws EvalError naming the limit when the render would pass it; without a current
  // budget (a value printed outside a render) the work is not counted, the sizes still are.
  static void ChargeWork(int64_t units);
  // Whether a render is under way on this thread.
  static bool Active();
  static void CheckString(size_t bytes);
  // CheckString for a string built at once (a concatenation, a repetition), its bytes also
  // charged as work (256 a step), so that copying big strings over and over ends as a loop does.
  static void Built(size_t bytes);
  static void CheckList(size_t items);

  // Entered around every call; throws past kMaxCallDepth.
  class Call {
   public:
    Call();
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
  };

 private:
  int64_t work_ = 0;
  int call_depth_ = 0;
  RenderBudget* previous_;
};

}  // namespace engine::jinja
