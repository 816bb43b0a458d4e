// The best wall time of a few runs of a piece of work: what the in-process benchmarks compare
// (the shared cores here are noisy; the best run is the one least disturbed).
#pragma once

#include <algorithm>
#include <chrono>

namespace engine::bench {

// Runs `work` once to warm caches and allocators, then `repeats` times; the shortest, in seconds.
template <typename Work>
double BestSeconds(int repeats, Work&& work) {
  using Clock = std::chrono::steady_clock;
  work();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    work();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

}  // namespace engine::bench
