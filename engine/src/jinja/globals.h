// The global functions a chat template can call: Jinja2's range, namespace and dict, and the
// two transformers adds, raise_exception (fails the render with the template's message) and
// strftime_now (the local time, formatted as Python's strftime does).
#pragma once

#include "jinja/value.h"

namespace engine::jinja {

ValueDict MakeGlobals();

// The prefix of the message a raise_exception call fails with.
inline constexpr const char kRaisedPrefix[] = "the template raised an error: ";

}  // namespace engine::jinja
