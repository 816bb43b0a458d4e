#include "core/allocator.h"

#include <malloc.h>

#include <climits>
#include <cstdlib>
#include <cstring>

namespace engine {

namespace {

// 32 MB is the largest threshold mallopt accepts on 64-bit glibc.
constexpr int kTrainingMmapThreshold = 32 * 1024 * 1024;
bool configured = false;

}  // namespace

bool ConfigureAllocatorForTraining() {
  configured = false;
  const char* opt_out = std::getenv("ENGINE_DEFAULT_MALLOC");
  if (opt_out != nullptr && std::strcmp(opt_out, "0") != 0 && *opt_out != '\0') return false;
  const bool threshold = mallopt(M_MMAP_THRESHOLD, kTrainingMmapThreshold) == 1;
  const bool trim = mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
  configured = threshold && trim;
  return configured;
}

LargeBlocksFromMmap::LargeBlocksFromMmap(int bytes) {
  if (configured) applied_ = mallopt(M_MMAP_THRESHOLD, bytes) == 1;
}

LargeBlocksFromMmap::~LargeBlocksFromMmap() {
  if (applied_) mallopt(M_MMAP_THRESHOLD, kTrainingMmapThreshold);
}

void ReturnFreedMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace engine
