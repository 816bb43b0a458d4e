#include "engine/host_memory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/system_files.h"

namespace engine {
namespace {

// "MemAvailable:   123456 kB" -> bytes; nullopt when the key is absent.
std::optional<int64_t> MeminfoBytes(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    long long kib = 0;
    if (std::sscanf(line.c_str() + key.size() + 1, "%lld", &kib) != 1) return std::nullopt;
    return static_cast<int64_t>(kib) * 1024;
  }
  return std::nullopt;
}

// memory.max - memory.current of this process's cgroup (v2), when it has a limit.
std::optional<int64_t> CgroupHeadroom() {
  const std::string max = CgroupFile("memory.max");
  const std::string current = CgroupFile("memory.current");
  if (max.empty() || max.rfind("max", 0) == 0 || current.empty()) return std::nullopt;
  return std::max<int64_t>(0, std::atoll(max.c_str()) - std::atoll(current.c_str()));
}

}  // namespace

std::optional<int64_t> AvailableHostMemory() {
  if (const char* forced = std::getenv("ENGINE_AVAILABLE_MEMORY"); forced && *forced) {
    char* end = nullptr;
    const long long bytes = std::strtoll(forced, &end, 10);
    if (end != forced && *end == '\0' && bytes >= 0) return bytes;
  }
  const std::string meminfo = ReadSmallFile("/proc/meminfo");
  const std::optional<int64_t> available = MeminfoBytes(meminfo, "MemAvailable");
  if (!available) return std::nullopt;
  int64_t bytes = *available + MeminfoBytes(meminfo, "SwapFree").value_or(0);
  if (const auto headroom = CgroupHeadroom()) bytes = std::min(bytes, *headroom);
  return bytes;
}

std::string MemoryText(int64_t bytes) {
  char text[32];
  if (bytes >= 1000LL * 1000 * 1000) {
    std::snprintf(text, sizeof(text), "%.2f GB", bytes / 1e9);
  } else {
    std::snprintf(text, sizeof(text), "%lld MB",
                  static_cast<long long>((bytes + 999999) / 1000000));
  }
  return text;
}

}  // namespace engine
