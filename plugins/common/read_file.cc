#include "read_file.h"

#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "engine/untrusted_file.h"

namespace engine::plugins {

StatusOr<std::string> ReadMaybeCompressed(const std::filesystem::path& path) {
  ENGINE_ASSIGN_OR_RETURN(const uint64_t limit, FileLimit(FileKind::kData));
  ENGINE_ASSIGN_OR_RETURN(const int fd, OpenUntrustedFile(path, FileKind::kData));
  gzFile file = gzdopen(fd, "rb");
  if (file == nullptr) {
    ::close(fd);
    return IoError("cannot read '" + path.string() + "': out of memory");
  }
  std::string content;
  char buffer[1 << 16];
  int n = 0;
  // Decompressed, a small file can be a large one.
  while (content.size() <= limit && (n = gzread(file, buffer, sizeof(buffer))) > 0) {
    content.append(buffer, n);
  }
  int error_code = Z_OK;
  const char* error_text = gzerror(file, &error_code);
  const std::string message = error_text != nullptr ? error_text : "";
  gzclose(file);
  if (content.size() > limit) {
    return CheckFileLimit(FileKind::kData, content.size(), "'" + path.string() + "'");
  }
  if (n < 0 || (error_code != Z_OK && error_code != Z_STREAM_END)) {
    return DataLossError("cannot read '" + path.string() + "'" +
                         (message.empty() ? std::string() : ": " + message) +
                         " (is the file truncated?)");
  }
  return content;
}

}  // namespace engine::plugins
