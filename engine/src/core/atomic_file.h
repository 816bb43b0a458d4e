// Files that appear whole or not at all.
//
// WriteFileAtomically writes to a temporary file beside the target, fsyncs it, renames it over the
// target and fsyncs the directory, so a crash or kill at any moment leaves either the old file or
// the new one, never a mix. Temporary files are named "<target>.tmp-<pid>-<n>" and removed on
// failure.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string_view>

#include "engine/status.h"

namespace engine {

// Streams content through `write_body`, which calls `sink(bytes, size)` any number of times and
// returns its own Status.
using ByteSink = std::function<Status(const void* bytes, size_t size)>;
Status WriteFileAtomically(const std::filesystem::path& path,
                           const std::function<Status(const ByteSink& sink)>& write_body);

Status WriteFileAtomically(const std::filesystem::path& path, std::string_view content);

// fsync on a directory, so renames inside it are durable.
Status SyncDirectory(const std::filesystem::path& dir);

// Reads a whole file; errors name the file and the reason.
StatusOr<std::string> ReadFile(const std::filesystem::path& path);

}  // namespace engine
