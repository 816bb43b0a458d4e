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
#include <utility>

namespace engine {

void RemoveTree(const std::filesystem::path& path, std::error_code& ec);

// Removes `path` (RemoveTree, errors ignored) when it goes out of scope, unless released first: a
// temporary directory that must not outlive a write that failed.
class ScopedRemoveTree {
 public:
  explicit ScopedRemoveTree(std::filesystem::path path) : path_(std::move(path)) {}
  ~ScopedRemoveTree() {
    std::error_code ignored;
    if (!path_.empty()) RemoveTree(path_, ignored);
  }
  ScopedRemoveTree(const ScopedRemoveTree&) = delete;
  ScopedRemoveTree& operator=(const ScopedRemoveTree&) = delete;
  // Keeps the path.
  void Release() { path_.clear(); }

 private:
  std::filesystem::path path_;
};

}  // namespace engine
