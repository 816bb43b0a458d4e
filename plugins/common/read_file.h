// Reading a data file whole, plain or gzip-compressed; shared by the data loaders that read files.
//
// Data files come from outside: they are read as engine/untrusted_file.h reads them (regular files
// only, at most the `data` limit after decompression). Errors name the file (missing, a directory
// or device, over the limit, truncated). Thread-compatible; nothing is cached.
#pragma once

#include <filesystem>
#include <string>

#include "engine/status.h"

namespace engine::plugins {

// zlib reads both plain and gzip files.
StatusOr<std::string> ReadMaybeCompressed(const std::filesystem::path& path);

}  // namespace engine::plugins
