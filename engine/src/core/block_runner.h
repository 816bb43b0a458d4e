// Where the engine decides how a model's blocks run (engine/model_block.h): a stage that runs
// blocks otherwise than as they are (shard_level 3's parameter shards, dist/parameter_shards.h)
// installs a BlockRunner for as long as its model may run; RunBlock hands every block to it.
//
// One runner at a time in the process (a stage runs its model on one thread at a time; the
// backward's recomputations run on LibTorch's backward threads, so a thread-local would not do).
// ScopedBlockRunner installs and, when destroyed, removes; installing a second one while one is in
// place is a bug and aborts.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace engine {

class BlockRunner {
 public:
  virtual ~BlockRunner() = default;
  // Runs `forward` on `input` for `block`, or returns an undefined tensor when `block` is none of
  // this runner's (RunBlock then runs it as it would without a runner).
  virtual at::Tensor Run(const torch::nn::Module& block,
                         const std::function<at::Tensor(const at::Tensor&)>& forward,
                         const at::Tensor& input, bool checkpointing) = 0;
};

class ScopedBlockRunner {
 public:
  explicit ScopedBlockRunner(BlockRunner* runner);  // null: installs nothing
  ~ScopedBlockRunner();
  ScopedBlockRunner(const ScopedBlockRunner&) = delete;
  ScopedBlockRunner& operator=(const ScopedBlockRunner&) = delete;

 private:
  BlockRunner* runner_;
};

// CheckpointedForward (engine/activation_checkpoint.h) with `acquire` called before each run of
// `block` (the first, and the recomputation in the backward) and `release` after it: what the
// block needs only while it runs (its gathered parameters). Outside grad mode the block runs once,
// between the two, without checkpointing.
at::Tensor CheckpointedForwardAround(const std::function<at::Tensor(const at::Tensor&)>& block,
                                     const at::Tensor& input, const std::function<void()>& acquire,
                                     const std::function<void()>& release);

}  // namespace engine
