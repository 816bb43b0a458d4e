#include "engine/model_block.h"

#include <glog/logging.h>

#include <atomic>

#include "core/block_runner.h"
#include "engine/activation_checkpoint.h"

namespace engine {
namespace {

std::atomic<BlockRunner*> installed_runner{nullptr};

}  // namespace

ScopedBlockRunner::ScopedBlockRunner(BlockRunner* runner) : runner_(runner) {
  if (runner_ == nullptr) return;
  BlockRunner* expected = nullptr;
  CHECK(installed_runner.compare_exchange_strong(expected, runner_))
      << "a second block runner was installed while one is in place";
}

ScopedBlockRunner::~ScopedBlockRunner() {
  if (runner_ != nullptr) installed_runner.store(nullptr);
}

at::Tensor RunBlock(const torch::nn::Module& block,
                    const std::function<at::Tensor(const at::Tensor&)>& forward,
                    const at::Tensor& input, bool checkpointing) {
  if (BlockRunner* runner = installed_runner.load()) {
    at::Tensor output = runner->Run(block, forward, input, checkpointing);
    if (output.defined()) return output;
  }
  return checkpointing ? CheckpointedForward(forward, input) : forward(input);
}

}  // namespace engine
