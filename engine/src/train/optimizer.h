// The optimizers a stage can name (AdamW, SGD), with state the engine can checkpoint by name.
//
// Parameters are updated in place from their .grad(); a parameter without a gradient this step is
// left alone, as in PyTorch. State tensors have the dtype and device of the weights they update (a
// sharded optimizer's masters, where it keeps them) and are named "<parameter>.<slot>"
// ("head.weight.exp_avg"), so an optimizer checkpoint is a plain safetensors file.
//
// Thread safety: one thread at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/tensor_pieces.h"
#include "core/named_parameter.h"
#include "engine/pipeline.pb.h"
#include "engine/safetensors.h"
#include "engine/status.h"

namespace engine {

// A parameter's gradient for one step when it is not simply the parameter's .grad(): the
// precision runtime hands over a master's low-precision gradient as backward left it, with the
// factor still to apply (1 / loss scale, the micro-batch mean, clipping) and the low-precision
// weight that receives the update. AdamW then unscales, casts, updates the f32 master and its
// moments and writes the low-precision weight in one pass (kernels/fused_adamw.h); elsewhere the
// gradient is cast to the parameter's dtype and scaled first, so the arithmetic is the same.
struct GradientFeed {
  at::Tensor grad;        // undefined: the parameter's own .grad(), unscaled
  double scale = 1;       // multiplies `grad`
  at::Tensor write_back;  // undefined, or receives the updated parameter (in its own dtype)
};

// The gradient of parameter `i` for a step: its feed where `feeds` has one, else its own .grad()
// with nothing to apply (undefined when it has none).
GradientFeed GradientOf(const at::Tensor& parameter, size_t i,
                        const std::vector<GradientFeed>& feeds);

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update at learning rate `lr` from the parameters' .grad().
  void Step(double lr) { Update(lr, {}); }
  // The same, with `feeds` empty or one per parameter (in the constructor's order).
  void Step(double lr, const std::vector<GradientFeed>& feeds) { Update(lr, feeds); }
  virtual std::string algorithm() const = 0;
  // Updates taken so far (restored by LoadState).
  int64_t steps() const { return steps_; }

  // The state's slots per parameter, in order ("exp_avg", "exp_avg_sq" for AdamW).
  virtual std::vector<std::string> slot_names() const = 0;

  // The whole state, by name; empty for an optimizer whose state is split across ranks.
  virtual safetensors::NamedTensors State() const = 0;
  // Whether each rank holds only its parts of the state (train/sharded_optimizer.h); a checkpoint
  // then holds every rank's StateParts(), not State().
  virtual bool sharded() const { return false; }
  // This rank's parts of the state, as pieces of the names State() would give them.
  virtual PiecesToWrite StateParts() const { return {}; }
  // Restores state saved by State() for the same parameters; refuses missing or misshapen entries.
  virtual Status LoadState(const safetensors::NamedTensors& state, int64_t steps) = 0;
  // The same from state saved whole or in any ranks' pieces; by default made whole for LoadState.
  virtual Status LoadStatePieces(const TensorPieces& state, int64_t steps);

 protected:
  virtual void Update(double lr, const std::vector<GradientFeed>& feeds) = 0;

  int64_t steps_ = 0;
};

std::unique_ptr<Optimizer> MakeOptimizer(const proto::Optimizer& config,
                                         std::vector<NamedParameter> parameters);

}  // namespace engine
