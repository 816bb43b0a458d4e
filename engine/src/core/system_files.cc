#include "core/system_files.h"

#include "core/atomic_file.h"

namespace engine {

std::string ReadSmallFile(const std::string& path) {
  StatusOr<std::string> text = ReadFile(path);
  return text.ok() ? *text : std::string();
}

std::string CgroupFile(const std::string& name) {
  const std::string cgroup = ReadSmallFile("/proc/self/cgroup");  // "0::/path"
  const size_t at = cgroup.find("0::");
  if (at == std::string::npos) return std::string();
  std::string path = cgroup.substr(at + 3);
  path = path.substr(0, path.find('\n'));
  return ReadSmallFile("/sys/fs/cgroup" + (path == "/" ? "" : path) + "/" + name);
}

}  // namespace engine
