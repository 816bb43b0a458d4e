// LibTorch's intra-op threads as the engine's own threads see them: how many threads the kernels'
// at::parallel_for really gets (the check that this library is built the way LibTorch's parallel
// backend needs), and keeping a helper thread's operations off the step's cores.
//
// at::parallel_for is inline; under LibTorch's OpenMP backend its threads come from a
// `#pragma omp parallel` compiled into the caller, so a library built without OpenMP runs every
// kernel on one thread while LibTorch reports more. Both functions are thread-safe.
#pragma once

#include <cstdint>

namespace engine::kernels {

// The number of distinct threads that ran `tasks` tasks of one at::parallel_for (grain 1) from
// this library's code: at::get_num_threads() where there are enough tasks, 1 inside a parallel
// region.
int ParallelForThreads(int64_t tasks);

// From now on, the ATen operations (and kernels) the calling thread runs stay on that thread,
// whatever LibTorch's thread count; other threads keep theirs. For a thread started beside the
// training step (the batch loader): OpenMP gives each thread that opens a parallel region a team
// of its own, so a loader's ops added a second team to the step's, more threads than cores, and
// every parallel region of the step then waited at its barrier for a thread the other team had
// taken the core from (the main job's llm stage took 1.6x as long on two cores as without).
// Call it again before each piece of work: LibTorch 2.x sets a thread's count lazily, on the
// first parallel_for each shared library runs there (at::internal::lazy_init_num_threads is
// inline, with a thread_local flag, and the engine's libraries hide their copies of it), and that
// sets the thread back to LibTorch's count once per library.
void KeepIntraOpWorkOnThisThread();

}  // namespace engine::kernels
