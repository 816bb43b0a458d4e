// Fields marked `(engine.required) = true` that a message leaves unset, as OptionErrors entries
// with their paths and help text. The engine checks these for every plugin's options before the
// plugin sees them; the conformance checks do the same.
#pragma once

#include <google/protobuf/message.h>

#include "engine/plugin.h"

namespace engine {

// Adds one entry per missing required field ("path", "is required (help)"), also inside set
// sub-messages. Returns whether none was missing.
bool CheckRequiredFields(const google::protobuf::Message& message, OptionErrors* errors);

}  // namespace engine
