// The operating system's small text files that describe this process and machine: /proc
// (meminfo), /sys (CPU topology), and this process's control group (cgroup v2), where containers
// put their limits (memory.max, cpu.max). For host_memory.cc and cpu_threads.cc.
//
// Thread-safe; each call reads the files it names.
#pragma once

#include <string>

namespace engine {

// The text of /sys/fs/cgroup/<this process's group>/<name>; empty when there is no cgroup v2 or
// the file cannot be read.
std::string CgroupFile(const std::string& name);

// A /proc or /sys file's text; empty when it cannot be read.
std::string ReadSmallFile(const std::string& path);

}  // namespace engine
