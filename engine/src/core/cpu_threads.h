// How many threads LibTorch's intra-op pool gets for a stage, and why: the plan prints the choice
// and the trainer applies it.
//
// In order: parallel.num_threads; OMP_NUM_THREADS (LibTorch read it at start); LibTorch's default
// where the BLAS keeps a pool of its own threads beside LibTorch's (OpenBLAS's pthreads build,
// whose spinning threads and OpenMP's fought over 2 cores and made the fp32 step 4x slower);
// otherwise the cores this process may use, shared among the ranks on this host. The cores are
// the physical cores of the CPUs in this process's affinity, at most its cgroup's CPU quota:
// LibTorch's own default counts cores through cpuinfo, which misreads some virtual machines (one
// core of the CI machines' two), and a container's quota does not show in the affinity.
//
// Thread-safe; reads a few small files under /proc and /sys.
#pragma once

#include <cstdint>
#include <string>

namespace engine {

struct CpuThreadPlan {
  int threads = 1;
  std::string reason;  // "parallel.num_threads", "the 2 cores this process may use", ...
};

// What the choice depends on, read from the process and the machine (or given by a test).
struct CpuThreadFacts {
  uint32_t requested = 0;        // parallel.num_threads; 0: not asked
  bool omp_num_threads = false;  // OMP_NUM_THREADS is set
  int libtorch_default = 1;      // at::get_num_threads() before the engine changes it
  bool blas_has_own_pool = false;
  int usable_cores = 1;
  int local_ranks = 1;  // ranks of this stage on this host
};

CpuThreadPlan ChooseCpuThreads(const CpuThreadFacts& facts);

// The facts of this process and machine.
CpuThreadFacts ReadCpuThreadFacts(uint32_t requested, int local_ranks);

// Sets LibTorch's intra-op threads (OpenMP's, which the OpenMP build of OpenBLAS shares).
void ApplyCpuThreads(const CpuThreadPlan& plan);

}  // namespace engine
