// Glob patterns over parameter names, as pipelines write them in `trainable { include: ... }`.
//
// `*` matches any run of characters (dots included, so "visual.*" selects a whole subtree), `?` one
// character, `[abc]` / `[a-z]` / `[!abc]` a class. The whole name must match.
#pragma once

#include <string>
#include <string_view>

namespace engine {

bool GlobMatch(std::string_view pattern, std::string_view text);

// Empty when `pattern` is well-formed; otherwise what is wrong with it.
std::string GlobSyntaxError(std::string_view pattern);

}  // namespace engine
