#include "core/allocator.h"

#include <malloc.h>

#include <climits>
#include <cstdlib>
#include <cstring>

namespace engine {

bool ConfigureAllocatorForTraining() {
  const char* opt_out = std::getenv("ENGINE_DEFAULT_MALLOC");
  if (opt_out != nullptr && std::strcmp(opt_out, "0") != 0 && *opt_out != '\0') return false;
  // 32 MB is the largest threshold mallopt accepts on 64-bit glibc.
  const bool threshold = mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1;
  const bool trim = mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
  return threshold && trim;
}

void ReturnFreedMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace engine
