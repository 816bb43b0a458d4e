// The optimizers a stage can name (AdamW, SGD), with state the engine can checkpoint by name.
//
// Parameters are updated in place from their .grad(); a parameter without a gradient this step is
// left alone, as in PyTorch. State tensors have the parameter's dtype and device and are named
// "<parameter>.<slot>" ("head.weight.exp_avg"), so an optimizer checkpoint is a plain safetensors
// file.
//
// Thread safety: one thread at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/pipeline.pb.h"
#include "engine/safetensors.h"
#include "engine/status.h"

namespace engine {

struct NamedParameter {
  std::string name;
  at::Tensor tensor;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update at learning rate `lr`.
  virtual void Step(double lr) = 0;
  virtual std::string algorithm() const = 0;
  // Updates taken so far (restored by LoadState).
  int64_t steps() const { return steps_; }

  virtual safetensors::NamedTensors State() const = 0;
  // Restores state saved by State() for the same parameters; refuses missing or misshapen entries.
  virtual Status LoadState(const safetensors::NamedTensors& state, int64_t steps) = 0;

 protected:
  int64_t steps_ = 0;
};

std::unique_ptr<Optimizer> MakeOptimizer(const proto::Optimizer& config,
                                         std::vector<NamedParameter> parameters);

// Scales all gradients so their global L2 norm is at most `max_norm`; returns the norm before.
double ClipGradNorm(const std::vector<NamedParameter>& parameters, double max_norm);

}  // namespace engine
