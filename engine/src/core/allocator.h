// How the engine's process asks glibc's malloc to behave while training.
//
// LibTorch allocates activations, gradients and optimizer temporaries with malloc and frees them
// every step. With glibc's defaults, blocks of a few MB come straight from mmap and go back to the
// kernel on free, and the heap is trimmed back to the kernel too, so every step faults the same
// memory in again: on a 2048x2048 MLP that made a CPU step 1.5-8x slower, and erratic
// (bench/train_loop_bench --default-malloc). Keeping freed memory in the process removes that; peak
// memory is unchanged, the process just does not give memory back until it exits.
#pragma once

namespace engine {

// Raises the mmap threshold to 32 MB and disables trimming. Call once, early in main(), before the
// large allocations. ENGINE_DEFAULT_MALLOC=1 in the environment keeps glibc's defaults. Returns
// whether the settings were applied.
bool ConfigureAllocatorForTraining();

// While alive, blocks of `bytes` or more that the heap cannot serve from memory it already holds
// come from mmap and go back to the kernel when freed, where ConfigureAllocatorForTraining() would
// grow the heap for anything up to 32 MB. For a stage whose point is memory (shard_level 3): each
// of its blocks' gradients is allocated and freed once a step, and the smaller allocations between
// them leave holes in the heap that the next ones do not fit, so the heap would grow by a few
// blocks' worth every step. Costs the page faults of those blocks. Does nothing where
// ConfigureAllocatorForTraining() did not apply. Training thread only; not nested.
class LargeBlocksFromMmap {
 public:
  explicit LargeBlocksFromMmap(int bytes);
  ~LargeBlocksFromMmap();
  // Whether the threshold was changed (ConfigureAllocatorForTraining() applied, mallopt agreed).
  bool applied() const { return applied_; }
  LargeBlocksFromMmap(const LargeBlocksFromMmap&) = delete;
  LargeBlocksFromMmap& operator=(const LargeBlocksFromMmap&) = delete;

 private:
  bool applied_ = false;
};

// Gives the memory freed so far back to the kernel, which the settings above keep in the process:
// after something large is freed that the next allocations may not reuse, because it was freed in
// holes they do not fit or in another thread's glibc arena (a stage's model, built and released
// before the next stage's is built elsewhere; a dense weight replaced by its 4-bit codes). Without
// it the process grows as if nothing had been freed. Costs a walk over the heap: not per step,
// except under LargeBlocksFromMmap, where memory comes before speed.
void ReturnFreedMemory();

}  // namespace engine
