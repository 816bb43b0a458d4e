// How a model runs one of its repeated blocks (an MLP layer, a decoder layer), so that the stage
// decides how it runs: as it is, with activation checkpointing, or, where the stage splits the
// parameters across its ranks (`parallel { strategy: SHARDED shard_level: 3 }`), with the block's
// trainable parameters gathered from the ranks for the block alone and let go after it, and
// gathered again in the backward, which then recomputes the block as checkpointing does.
//
//   for (size_t i = 0; i < layers->size(); ++i) {
//     auto layer = layers[i]->as<Layer>();
//     h = engine::RunBlock(*layer, [layer](const at::Tensor& x) { return layer->forward(x); }, h,
//                          checkpointing);
//   }
//
// A model that runs its blocks this way names them in Model::blocks() (engine/model.h); a stage
// may split the parameters of such a model only. `forward` must use no trainable parameter of the
// model outside `block`, and compute the same from the same input each time it runs (its random
// state is replayed, as CheckpointedForward does). Every rank of a level-3 stage runs the same
// blocks in the same order (each run is a collective); a failed collective throws, for the engine's
// guarded call to report. Called on the thread that runs Forward.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace engine {

at::Tensor RunBlock(const torch::nn::Module& block,
                    const std::function<at::Tensor(const at::Tensor&)>& forward,
                    const at::Tensor& input, bool checkpointing);

}  // namespace engine
