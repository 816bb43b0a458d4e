// libFuzzer target: a safetensors file (core/safetensors.cc), opened as a checkpoint or a hub
// model is opened, every tensor then read. The bytes go through a memfd, since File::Open maps a
// path.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz.safetensors", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    return 0;
  }
  auto file = engine::safetensors::File::Open(path);
  if (!file.ok()) return 0;
  (*file)->GetAll().status().IgnoreError();
  return 0;
}
