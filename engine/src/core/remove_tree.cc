#include "core/remove_tree.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

namespace engine {
namespace {

// nftw takes a plain function; the first error travels through this thread-local.
thread_local int first_errno = 0;

int RemoveEntry(const char* path, const struct stat* /*stat*/, int type, struct FTW* /*ftw*/) {
  const int rc = (type == FTW_DP) ? ::rmdir(path) : ::unlink(path);
  if (rc != 0 && errno != ENOENT && first_errno == 0) first_errno = errno;
  return 0;  // keep going: remove whatever can be removed
}

}  // namespace

void RemoveTree(const std::filesystem::path& path, std::error_code& ec) {
  ec.clear();
  struct stat info;
  if (::lstat(path.c_str(), &info) != 0) {
    if (errno != ENOENT) ec.assign(errno, std::generic_category());
    return;
  }
  if (!S_ISDIR(info.st_mode)) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) ec.assign(errno, std::generic_category());
    return;
  }
  first_errno = 0;
  if (::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS) != 0 && first_errno == 0) {
    first_errno = errno;
  }
  if (first_errno != 0) ec.assign(first_errno, std::generic_category());
}

}  // namespace engine
