// Removes a file or a directory with everything under it, like `rm -rf`.
//
// Use this instead of std::filesystem::remove_all: the pip builds of LibTorch 2.x export their own
// copy of that function (linked in from an older libstdc++), and calls from our code bind to it and
// crash. This one is plain POSIX (nftw, unlink, rmdir), so nothing can interpose it.
//
// Thread-safe as long as no two threads remove the same tree. Symbolic links are removed, never
// followed. A path that does not exist is not an error. On failure `ec` holds the first error and
// the removal continues with what it can still remove.
#pragma once

#include <filesystem>
#include <system_error>

namespace engine {

void RemoveTree(const std::filesystem::path& path, std::error_code& ec);

}  // namespace engine
