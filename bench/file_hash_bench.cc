// The cost of checkpoint content hashes (core/file_hash.h): XXH3-64 of a large file against reading
// it, both from the page cache, on one core. Every checkpoint file is hashed once when written and
// once each time the checkpoint is checked (reuse, resume, --from), so this is the whole overhead.
//
//   file_hash_bench [MiB]   (default 1024)
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <vector>

#include "core/file_hash.h"

namespace {

double Seconds(const std::chrono::steady_clock::time_point& start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Reads the file in 4 MiB blocks and throws the bytes away: the floor any hash pays.
double ReadSeconds(const std::filesystem::path& path) {
  const auto start = std::chrono::steady_clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  std::vector<char> block(4 << 20);
  while (::read(fd, block.data(), block.size()) > 0) {
  }
  ::close(fd);
  return Seconds(start);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1024;
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("file_hash_bench-" + std::to_string(::getpid()));
  {
    std::vector<uint32_t> block((1 << 20) / 4);
    std::mt19937 random(42);
    for (uint32_t& word : block) word = random();
    FILE* out = std::fopen(path.c_str(), "wb");
    for (size_t i = 0; i < mib; ++i) std::fwrite(block.data(), 4, block.size(), out);
    std::fclose(out);
  }
  ReadSeconds(path);  // into the page cache
  double read = 1e9, hash = 1e9;
  for (int round = 0; round < 3; ++round) {
    read = std::min(read, ReadSeconds(path));
    const auto start = std::chrono::steady_clock::now();
    if (!engine::FileContentHash(path).ok()) return 1;
    hash = std::min(hash, Seconds(start));
  }
  std::filesystem::remove(path);
  const double gib = static_cast<double>(mib) / 1024;
  std::printf("%zu MiB from the page cache, best of 3:\n", mib);
  std::printf("  read only        %6.3f s  %6.2f GiB/s\n", read, gib / read);
  std::printf("  read + XXH3-64   %6.3f s  %6.2f GiB/s  (hash adds %.0f%% to the read)\n", hash,
              gib / hash, 100 * (hash - read) / read);
  return 0;
}
