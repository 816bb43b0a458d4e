#include "core/file_hash.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/hash.h"

namespace engine {

StatusOr<std::string> FileContentHash(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot read '" + path.string() + "': " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(),
                                                                        XXH3_freeState);
  XXH3_64bits_reset(state.get());
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> block(4 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, block.data(), block.size());
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("cannot read '" + path.string() + "': " + std::strerror(errno));
    }
    XXH3_64bits_update(state.get(), block.data(), static_cast<size_t>(n));
  }
  return HashHex(XXH3_64bits_digest(state.get()));
}

std::string ContentHash(std::string_view bytes) {
  return HashHex(XXH3_64bits(bytes.data(), bytes.size()));
}

}  // namespace engine
