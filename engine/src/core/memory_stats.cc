#include <unistd.h>

#include <fstream>
#include <string>

#include "engine/callback.h"
#include "engine/torch_compat.h"

namespace engine {
namespace {

// "VmHWM:     1234 kB" -> bytes.
int64_t StatusField(const std::string& text, const std::string& key) {
  size_t at = text.find(key + ":");
  if (at == std::string::npos) return 0;
  return std::stoll(text.substr(at + key.size() + 1)) * 1024;
}

}  // namespace

MemoryStats ReadMemoryStats() {
  MemoryStats stats;
  std::ifstream status("/proc/self/status");
  std::string text((std::istreambuf_iterator<char>(status)), std::istreambuf_iterator<char>());
  stats.rss_bytes = StatusField(text, "VmRSS");
  stats.peak_rss_bytes = StatusField(text, "VmHWM");
  stats.cuda = compat::CudaMemory(&stats.cuda_allocated_bytes, &stats.cuda_reserved_bytes,
                                  &stats.cuda_peak_allocated_bytes);
  return stats;
}

}  // namespace engine
