#include "read_file.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>

namespace engine::plugins {

StatusOr<std::string> ReadMaybeCompressed(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return InvalidArgumentError("'" + path.string() + "' is a directory, not a data file");
  }
  errno = 0;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return NotFoundError("cannot open '" + path.string() +
                         "': " + (errno ? std::strerror(errno) : "unknown error"));
  }
  std::string content;
  char buffer[1 << 16];
  int n;
  while ((n = gzread(file, buffer, sizeof(buffer))) > 0) content.append(buffer, n);
  int error_code = Z_OK;
  const char* error_text = gzerror(file, &error_code);
  const std::string message = error_text != nullptr ? error_text : "";
  gzclose(file);
  if (n < 0 || (error_code != Z_OK && error_code != Z_STREAM_END)) {
    return DataLossError("cannot read '" + path.string() + "'" +
                         (message.empty() ? std::string() : ": " + message) +
                         " (is the file truncated?)");
  }
  return content;
}

}  // namespace engine::plugins
