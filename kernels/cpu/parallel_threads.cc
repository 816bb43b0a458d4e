#include "engine_kernels/parallel_threads.h"

#include <ATen/Parallel.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include <mutex>
#include <set>
#include <thread>

namespace engine::kernels {

int ParallelForThreads(int64_t tasks) {
  std::mutex mutex;
  std::set<std::thread::id> threads;
  at::parallel_for(0, tasks, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(std::this_thread::get_id());
  });
  return static_cast<int>(threads.size());
}

void KeepIntraOpWorkOnThisThread() {
#if defined(_OPENMP)
  // The thread count is OpenMP's per-thread setting. ATen sets it from its global count the first
  // time a thread asks for it, so that happens first; otherwise it would undo the 1 later.
  at::get_num_threads();
  omp_set_num_threads(1);
#endif
}

}  // namespace engine::kernels
