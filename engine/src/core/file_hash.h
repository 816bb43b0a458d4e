// A content hash of a file: XXH3-64 of its bytes, as 16 lowercase hex digits.
//
// Checkpoint manifests record one per file, so that bytes changed in place (same size, other
// contents) are found before a checkpoint is reused or resumed from. XXH3 is not cryptographic: it
// detects accidental damage (a bad disk, a stray write, a copy cut short), not tampering. It reads
// at memory speed on one core (bench/file_hash_bench: about 8 GB/s from the page cache on this
// machine, so a 1 GB checkpoint costs well under a second); the file is read in 4 MiB blocks.
//
// Any thread. Fails with an IO error naming the file.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "engine/status.h"

namespace engine {

StatusOr<std::string> FileContentHash(const std::filesystem::path& path);

// The same hash of bytes in memory.
std::string ContentHash(std::string_view bytes);

}  // namespace engine
