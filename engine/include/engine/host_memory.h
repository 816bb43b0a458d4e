// How much more memory this process can take on the host, for refusing a load that cannot fit
// before it starts (instead of the kernel's OOM killer ending the run part-way).
//
// The figure is /proc/meminfo's MemAvailable plus SwapFree, lowered to what the process's cgroup
// (v2: memory.max less memory.current) leaves, as in a container with a memory limit. The
// environment variable ENGINE_AVAILABLE_MEMORY (bytes) replaces the measurement: for machines
// whose accounting it misreads, and for tests. Thread-safe; reads a few small files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace engine {

// nullopt when it cannot be told (no /proc, say).
std::optional<int64_t> AvailableHostMemory();

// "2.20 GB" (decimal gigabytes, as file sizes are given), "512 MB" under a gigabyte.
std::string MemoryText(int64_t bytes);

}  // namespace engine
