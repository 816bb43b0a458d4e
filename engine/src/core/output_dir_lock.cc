#include "core/output_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace engine {
namespace {

// What the holder wrote into the lock file, on one line.
std::string ReadHolder(int fd) {
  std::string text(512, '\0');
  const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  return text.empty() ? "a process that has not written its pid yet" : text;
}

Status WriteHolder(int fd, const std::filesystem::path& lock_file, const std::string& holder) {
  const std::string text = "pid " + std::to_string(::getpid()) + " (" + holder + ")\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    return IoError("cannot write '" + lock_file.string() + "': " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<OutputDirLock>> OutputDirLock::Acquire(const std::filesystem::path& dir,
                                                                const std::string& holder) {
  if (dir.empty()) return InvalidArgumentError("the output directory is empty");
  std::error_code ec;
  std::filesystem::path created;
  for (std::filesystem::path p = dir; !p.empty() && !std::filesystem::exists(p, ec);
       p = p.parent_path()) {
    created = p;
    if (p == p.parent_path()) break;
  }
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return IoError("cannot create the output directory '" + dir.string() + "': " + ec.message());
  }
  const std::filesystem::path lock_file = dir / kOutputDirLockFile;
  const int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return IoError("cannot write into the output directory '" + dir.string() + "' (" +
                   lock_file.string() + ": " + std::strerror(errno) + ")");
  }
  std::unique_ptr<OutputDirLock> lock(new OutputDirLock(fd, dir, created));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return FailedPreconditionError(
          "the output directory '" + dir.string() + "' is in use by another run: " +
          ReadHolder(fd) + ". Wait for it to finish, stop it, or choose another --output_dir");
    }
    return IoError("cannot lock '" + lock_file.string() + "': " + std::strerror(errno));
  }
  ENGINE_RETURN_IF_ERROR(WriteHolder(fd, lock_file, holder));
  return lock;
}

OutputDirLock::~OutputDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputDirLock::ReleaseUnused() {
  // Unlinked while still held: a run starting at this moment locks a file of its own.
  std::error_code ec;
  std::filesystem::remove(dir_ / kOutputDirLockFile, ec);
  ::close(fd_);
  fd_ = -1;
  if (created_.empty()) return;
  for (std::filesystem::path p = dir_;; p = p.parent_path()) {
    if (!std::filesystem::remove(p, ec) || p == created_ || p == p.parent_path()) break;
  }
}

}  // namespace engine
