// Canonical text of configurations, for stage fingerprints (hashed with engine/hash.h).
//
// CanonicalText prints every field of a message, set or not (defaults included), in field-number
// order, so two configurations that mean the same thing print the same, and a changed default in a
// new engine version changes the text. A google.protobuf.Any prints as its type URL only: callers
// hash plugin options from the unpacked message.
#pragma once

#include <google/protobuf/message.h>

#include <string>

namespace engine {

std::string CanonicalText(const google::protobuf::Message& message);

}  // namespace engine
