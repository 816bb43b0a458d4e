#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

namespace engine {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// Closes the descriptor and removes the temporary file unless released.
class TempFile {
 public:
  TempFile(std::filesystem::path path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!released_) {
      std::error_code ignored;
      std::filesystem::remove(path_, ignored);
    }
  }
  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return path_; }
  Status Close() {
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0)
      return IoError("cannot close '" + path_.string() + "': " + ErrnoText(errno));
    return Status::Ok();
  }
  void Release() { released_ = true; }

 private:
  std::filesystem::path path_;
  int fd_;
  bool released_ = false;
};

std::filesystem::path TempPathFor(const std::filesystem::path& path) {
  static std::atomic<uint64_t> counter{0};
  std::string name = path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                     std::to_string(counter.fetch_add(1));
  return path.parent_path() / name;
}

}  // namespace

Status SyncDirectory(const std::filesystem::path& dir) {
  std::filesystem::path target = dir.empty() ? std::filesystem::path(".") : dir;
  int fd = ::open(target.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return IoError("cannot open directory '" + target.string() + "': " + ErrnoText(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return IoError("cannot sync directory '" + target.string() + "': " + ErrnoText(err));
  return Status::Ok();
}

Status WriteFileAtomically(const std::filesystem::path& path,
                           const std::function<Status(const ByteSink& sink)>& write_body) {
  std::filesystem::path temp_path = TempPathFor(path);
  int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return IoError("cannot create '" + temp_path.string() + "': " + ErrnoText(errno));
  }
  TempFile temp(temp_path, fd);
  ByteSink sink = [&temp](const void* bytes, size_t size) -> Status {
    const char* p = static_cast<const char*>(bytes);
    while (size > 0) {
      ssize_t n = ::write(temp.fd(), p, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoError("cannot write '" + temp.path().string() + "': " + ErrnoText(errno));
      }
      p += n;
      size -= static_cast<size_t>(n);
    }
    return Status::Ok();
  };
  ENGINE_RETURN_IF_ERROR(write_body(sink));
  if (::fsync(temp.fd()) != 0) {
    return IoError("cannot sync '" + temp_path.string() + "': " + ErrnoText(errno));
  }
  ENGINE_RETURN_IF_ERROR(temp.Close());
  if (::rename(temp_path.c_str(), path.c_str()) != 0) {
    return IoError("cannot rename '" + temp_path.string() + "' to '" + path.string() +
                   "': " + ErrnoText(errno));
  }
  temp.Release();
  return SyncDirectory(path.parent_path());
}

Status WriteFileAtomically(const std::filesystem::path& path, std::string_view content) {
  return WriteFileAtomically(
      path, [content](const ByteSink& sink) { return sink(content.data(), content.size()); });
}

StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open '" + path.string() + "': " + ErrnoText(errno));
  std::string content;
  char buffer[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return IoError("cannot read '" + path.string() + "': " + ErrnoText(err));
    }
    if (n == 0) break;
    content.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return content;
}

}  // namespace engine
