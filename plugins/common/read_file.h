// Reading a data file whole, plain or gzip-compressed; shared by the data loaders that read files.
//
// Errors name the file (missing, a directory, truncated). Thread-compatible; nothing is cached.
#pragma once

#include <filesystem>
#include <string>

#include "engine/status.h"

namespace engine::plugins {

// zlib reads both plain and gzip files.
StatusOr<std::string> ReadMaybeCompressed(const std::filesystem::path& path);

}  // namespace engine::plugins
