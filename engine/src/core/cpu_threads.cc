#include "core/cpu_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <utility>

#include "core/system_files.h"

namespace engine {
namespace {

// The thread count LibTorch started with, read once before ApplyCpuThreads can change it.
int LibTorchDefaultThreads() {
  static const int threads = at::get_num_threads();
  return threads;
}

// OpenBLAS's build says how it runs threads: 0 sequential, 1 its own pthreads, 2 OpenMP's pool.
// Absent (another BLAS, or MKL with LibTorch's OpenMP): no pool of its own.
bool BlasHasOwnThreadPool() {
  using GetParallel = int (*)();
  auto get_parallel = reinterpret_cast<GetParallel>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  return get_parallel != nullptr && get_parallel() == 1;
}

// Distinct (package, core) pairs among the CPUs this process may run on; the CPUs themselves
// where the topology cannot be read.
int PhysicalCoresInAffinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  std::set<std::pair<std::string, std::string>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string topology = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    const std::string core = ReadSmallFile(topology + "core_id");
    const std::string package = ReadSmallFile(topology + "physical_package_id");
    if (core.empty() || package.empty()) return CPU_COUNT(&set);
    cores.emplace(package, core);
  }
  return std::max(1, static_cast<int>(cores.size()));
}

// cpu.max "QUOTA PERIOD" in whole CPUs (rounded up); `otherwise` for "max" or no cgroup.
int CgroupCpuLimit(int otherwise) {
  const std::string max = CgroupFile("cpu.max");
  long long quota = 0, period = 0;
  if (std::sscanf(max.c_str(), "%lld %lld", &quota, &period) != 2 || quota <= 0 || period <= 0) {
    return otherwise;
  }
  return static_cast<int>(std::max(1LL, (quota + period - 1) / period));
}

}  // namespace

CpuThreadPlan ChooseCpuThreads(const CpuThreadFacts& facts) {
  if (facts.requested > 0) {
    return {static_cast<int>(facts.requested), "parallel.num_threads"};
  }
  if (facts.omp_num_threads) return {facts.libtorch_default, "OMP_NUM_THREADS"};
  if (facts.blas_has_own_pool) {
    return {facts.libtorch_default,
            "LibTorch's default: OpenBLAS (pthreads build) keeps threads of its own on every "
            "core; install libopenblas0-openmp to share one pool"};
  }
  const int ranks = std::max(1, facts.local_ranks);
  const int threads = std::max(1, facts.usable_cores / ranks);
  std::string reason = "the " + std::to_string(facts.usable_cores) +
                       (facts.usable_cores == 1 ? " core" : " cores") + " this process may use";
  if (ranks > 1) reason += ", shared by " + std::to_string(ranks) + " ranks on this host";
  return {threads, reason};
}

CpuThreadFacts ReadCpuThreadFacts(uint32_t requested, int local_ranks) {
  CpuThreadFacts facts;
  facts.requested = requested;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  facts.omp_num_threads = omp != nullptr && *omp != '\0';
  facts.libtorch_default = LibTorchDefaultThreads();
  facts.blas_has_own_pool = BlasHasOwnThreadPool();
  const int cores = PhysicalCoresInAffinity();
  facts.usable_cores = std::min(cores, CgroupCpuLimit(cores));
  facts.local_ranks = local_ranks;
  return facts;
}

void ApplyCpuThreads(const CpuThreadPlan& plan) {
  LibTorchDefaultThreads();  // remembered before it changes
  if (at::get_num_threads() != plan.threads) at::set_num_threads(plan.threads);
}

}  // namespace engine
