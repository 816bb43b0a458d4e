#include "engine_kernels/parallel_threads.h"

#include <ATen/Parallel.h>

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

}  // namespace engine::kernels
