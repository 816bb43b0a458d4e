// The fault boundary around every call into plugin code (and into LibTorch from it): whatever the
// call throws comes back as an error with the plugin's context, so a plugin can fail a stage but
// never crash the engine.
//
//   Status s = GuardedCall("stage 'train' data loader 'digits'", [&] { return plugin.Open(...); });
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "engine/status.h"

namespace engine {

// The message of the exception being handled (call only inside a catch block). LibTorch errors lose
// their C++ backtrace, which means nothing to a user.
std::string CurrentExceptionMessage();

template <typename Fn>
auto GuardedCall(const std::string& context, Fn&& fn) -> decltype(fn()) {
  try {
    return std::forward<Fn>(fn)().WithContext(context);
  } catch (...) {
    return InternalError(context + ": " + CurrentExceptionMessage());
  }
}

}  // namespace engine
