// The files of this process's control group (cgroup v2), where containers put their limits:
// memory.max for host_memory.cc, cpu.max for cpu_threads.cc.
//
// Thread-safe; reads /proc/self/cgroup and the one file asked for.
#pragma once

#include <string>

namespace engine {

// The text of /sys/fs/cgroup/<this process's group>/<name>; empty when there is no cgroup v2 or
// the file cannot be read.
std::string CgroupFile(const std::string& name);

// A /proc or /sys file's text; empty when it cannot be read.
std::string ReadSmallFile(const std::string& path);

}  // namespace engine
