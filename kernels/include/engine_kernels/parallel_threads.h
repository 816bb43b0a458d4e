// How many threads the kernels' at::parallel_for really gets: the check that this library is built
// the way LibTorch's parallel backend needs.
//
// at::parallel_for is inline; under LibTorch's OpenMP backend its threads come from a
// `#pragma omp parallel` compiled into the caller, so a library built without OpenMP runs every
// kernel on one thread while LibTorch reports more. Thread-safe (it only runs a parallel_for).
#pragma once

#include <cstdint>

namespace engine::kernels {

// The number of distinct threads that ran `tasks` tasks of one at::parallel_for (grain 1) from
// this library's code: at::get_num_threads() where there are enough tasks, 1 inside a parallel
// region.
int ParallelForThreads(int64_t tasks);

}  // namespace engine::kernels
