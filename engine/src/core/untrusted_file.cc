#include "engine/untrusted_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>

namespace engine {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * 1024;
constexpr uint64_t kGiB = kMiB * 1024;
constexpr const char kLimitsVariable[] = "ENGINE_FILE_LIMITS";

// Each kind's name (what ENGINE_FILE_LIMITS takes) and default limit, in FileKind's order. The
// defaults are about 100x the largest real file of each kind: a hub config is tens of KB, Gemma's
// tokenizer.json 33 MB, a chat template 20 KB, a chat line rarely 1 MB.
struct KindInfo {
  std::string_view name;
  uint64_t default_limit;
};
constexpr KindInfo kKindInfo[] = {{"config", 64 * kMiB},   {"tokenizer", 1 * kGiB},
                                  {"template", 16 * kMiB}, {"image", 256 * kMiB},
                                  {"data", 8 * kGiB},      {"data_line", 16 * kMiB}};
static_assert(std::size(kKindInfo) == std::size(kFileKinds));

const KindInfo& Info(FileKind kind) { return kKindInfo[static_cast<size_t>(kind)]; }

std::string SizeText(uint64_t bytes) {
  if (bytes % kGiB == 0) return std::to_string(bytes / kGiB) + " GiB";
  if (bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  if (bytes % kKiB == 0) return std::to_string(bytes / kKiB) + " KiB";
  return std::to_string(bytes) + " bytes";
}

// "512MiB", "4096", "2GiB" -> bytes.
StatusOr<uint64_t> ParseSize(std::string_view text, const std::string& where) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string_view unit = text.substr(digits);
  uint64_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "KiB") scale = kKiB;
  if (unit == "MiB") scale = kMiB;
  if (unit == "GiB") scale = kGiB;
  if (digits == 0 || digits > 12 || scale == 0) {
    return InvalidArgumentError(where + ": '" + std::string(text) +
                                "' is not a size (a whole number of bytes, KiB, MiB or GiB)");
  }
  const uint64_t value = std::stoull(std::string(text.substr(0, digits)));
  if (value == 0) return InvalidArgumentError(where + ": a limit of 0 would refuse every file");
  if (value > std::numeric_limits<uint64_t>::max() / scale) {
    return InvalidArgumentError(where + ": '" + std::string(text) + "' is more than 2^64 bytes");
  }
  return value * scale;
}

struct Limits {
  Status error;
  std::array<uint64_t, std::size(kFileKinds)> bytes{};
};

Limits ParseLimits(const char* setting) {
  Limits limits;
  for (FileKind kind : kFileKinds)
    limits.bytes[static_cast<size_t>(kind)] = Info(kind).default_limit;
  if (setting == nullptr) return limits;
  std::string_view rest(setting);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    const std::string where = std::string(kLimitsVariable) + " item '" + std::string(item) + "'";
    const size_t equals = item.find('=');
    bool known = false;
    for (FileKind kind : kFileKinds) {
      if (equals == std::string_view::npos || item.substr(0, equals) != FileKindName(kind)) {
        continue;
      }
      known = true;
      StatusOr<uint64_t> size = ParseSize(item.substr(equals + 1), where);
      if (!size.ok()) {
        limits.error = size.status();
        return limits;
      }
      limits.bytes[static_cast<size_t>(kind)] = *size;
    }
    if (!known) {
      limits.error = InvalidArgumentError(
          where +
          " is not KIND=SIZE with KIND one of config, tokenizer, template, image, data, "
          "data_line");
      return limits;
    }
  }
  return limits;
}

const Limits& CurrentLimits() {
  static const Limits limits = ParseLimits(std::getenv(kLimitsVariable));
  return limits;
}

std::string WhatItIs(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string_view FileKindName(FileKind kind) { return Info(kind).name; }

StatusOr<uint64_t> FileLimit(FileKind kind) {
  const Limits& limits = CurrentLimits();
  if (!limits.error.ok()) return limits.error;
  return limits.bytes[static_cast<size_t>(kind)];
}

StatusOr<std::string> FileLimitsSummary() {
  std::string out;
  for (FileKind kind : kFileKinds) {
    ENGINE_ASSIGN_OR_RETURN(uint64_t limit, FileLimit(kind));
    out += (out.empty() ? "" : ", ") + std::string(FileKindName(kind)) + " " + SizeText(limit);
  }
  return out;
}

Status CheckFileLimit(FileKind kind, uint64_t bytes, const std::string& what) {
  ENGINE_ASSIGN_OR_RETURN(uint64_t limit, FileLimit(kind));
  if (bytes <= limit) return Status::Ok();
  const std::string name(FileKindName(kind));
  return InvalidArgumentError(what + " is larger than the " + SizeText(limit) + " limit for " +
                              name + (kind == FileKind::kDataLine ? "s" : " files") + " (set " +
                              kLimitsVariable + "=" + name + "=SIZE to allow more)");
}

StatusOr<int> OpenRegularFile(const std::filesystem::path& path, std::string_view kind,
                              uint64_t* size) {
  const std::string what = "'" + path.string() + "'";
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string reason = std::strerror(err);
    if (err == ENOENT) return NotFoundError("cannot open " + what + ": " + reason);
    return IoError("cannot open " + what + ": " + reason);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError("cannot stat " + what + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(what + " is " + WhatItIs(st.st_mode) + ", not a regular " +
                                std::string(kind) + " file");
  }
  // Reads block again as usual: a regular file never waits, and the flag is only for the open.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

StatusOr<int> OpenUntrustedFile(const std::filesystem::path& path, FileKind kind) {
  ENGINE_RETURN_IF_ERROR(FileLimit(kind).status());
  uint64_t size = 0;
  ENGINE_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, FileKindName(kind), &size));
  const Status within = CheckFileLimit(kind, size, "'" + path.string() + "'");
  if (!within.ok()) {
    ::close(fd);
    return within;
  }
  return fd;
}

StatusOr<std::string> ReadUntrustedFile(const std::filesystem::path& path, FileKind kind) {
  ENGINE_ASSIGN_OR_RETURN(const uint64_t limit, FileLimit(kind));
  ENGINE_ASSIGN_OR_RETURN(const int fd, OpenUntrustedFile(path, kind));
  std::string content;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return IoError("cannot read '" + path.string() + "': " + std::strerror(err));
    }
    if (n == 0) break;
    content.append(buffer, static_cast<size_t>(n));
    // A file that grows while it is read is still held to the limit.
    if (content.size() > limit) {
      ::close(fd);
      return CheckFileLimit(kind, content.size(), "'" + path.string() + "'");
    }
  }
  ::close(fd);
  return content;
}

bool IsInsideDirectory(const std::filesystem::path& path, const std::filesystem::path& dir) {
  std::error_code ec;
  // Relative paths (an empty `dir` included) are taken from the working directory.
  const std::filesystem::path resolved =
      std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  if (ec) return false;
  const std::filesystem::path root =
      std::filesystem::weakly_canonical(std::filesystem::absolute(dir, ec), ec);
  if (ec || root.empty()) return false;
  auto r = root.begin();
  auto p = resolved.begin();
  for (; r != root.end(); ++r, ++p) {
    if (r->empty()) continue;  // a trailing separator
    if (p == resolved.end() || *p != *r) return false;
  }
  return true;
}

}  // namespace engine
