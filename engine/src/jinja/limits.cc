#include "jinja/limits.h"

#include <string>

#include "jinja/builtins.h"

namespace engine::jinja {
namespace {

thread_local RenderBudget* current = nullptr;

std::string Number(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

RenderBudget::RenderBudget() : previous_(current) { current = this; }
RenderBudget::~RenderBudget() { current = previous_; }

bool RenderBudget::Active() { return current != nullptr; }

void RenderBudget::ChargeWork(int64_t units) {
  if (current == nullptr) return;
  current->work_ += units;
  if (current->work_ > kMaxWork) {
    ThrowError("the template ran past " + Number(kMaxWork) +
               " steps (loop iterations, range() items and items filters go through, all counted "
               "together): a loop without end, or loops nested too deep for a chat template");
  }
}

void RenderBudget::CheckString(size_t bytes) {
  if (bytes > kMaxStringBytes) {
    ThrowError("the template would build a string of " + Number(static_cast<int64_t>(bytes)) +
               " bytes, above the " + Number(static_cast<int64_t>(kMaxStringBytes)) +
               " a chat template may build");
  }
}

void RenderBudget::Built(size_t bytes) {
  CheckString(bytes);
  ChargeWork(static_cast<int64_t>(bytes / 256));
}

void RenderBudget::CheckList(size_t items) {
  if (items > kMaxListItems) {
    ThrowError("the template would build a list of " + Number(static_cast<int64_t>(items)) +
               " items, above the " + Number(static_cast<int64_t>(kMaxListItems)) +
               " a chat template may build");
  }
}

RenderBudget::Call::Call() {
  if (current == nullptr) return;
  if (current->call_depth_ >= kMaxCallDepth) {
    ThrowError("calls nested deeper than " + std::to_string(kMaxCallDepth) +
               " (a macro that calls itself without end?)");
  }
  ++current->call_depth_;
}

RenderBudget::Call::~Call() {
  if (current != nullptr) --current->call_depth_;
}

}  // namespace engine::jinja
