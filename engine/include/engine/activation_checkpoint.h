// Activation (gradient) checkpointing for model authors: run a block without keeping its
// activations, and run it again during backward.
//
//   hidden = engine::CheckpointedForward([&](const at::Tensor& x) { return block->forward(x); },
//                                        hidden);
//
// The recomputation happens on LibTorch's backward threads, so it re-enters the precision context
// (autocast dtype) and the random state (dropout: the CPU's generator and the input's device's) of
// the first run: the gradients equal those of
// the plain backward. Parameters the block uses get their gradients accumulated as usual, also when
// `input` itself needs none. Outside grad mode (evaluation) the block simply runs.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace engine {

at::Tensor CheckpointedForward(const std::function<at::Tensor(const at::Tensor&)>& block,
                               const at::Tensor& input);

}  // namespace engine
