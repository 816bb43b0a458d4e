// Where relative paths point. Every path in a pipeline file or in a plugin's options is relative to
// the pipeline file's directory (the `base_dir` of DataContext, ModelContext and CallbackContext);
// this is the one place that says how such a path is resolved.
#pragma once

#include <filesystem>

namespace engine {

// `path` as it is when absolute, else under `base_dir`; "." and ".." are folded away, so the same
// file reads the same in plans, errors and identities however the pipeline spelled it.
inline std::filesystem::path ResolvePath(const std::filesystem::path& base_dir,
                                         const std::filesystem::path& path) {
  return (path.is_absolute() ? path : base_dir / path).lexically_normal();
}

}  // namespace engine
