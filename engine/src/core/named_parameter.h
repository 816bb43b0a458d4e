// A trainable tensor and the name it has in the model's state dict ("layers.0.mlp.up.weight"):
// what optimizers, the precision runtime and the data-parallel code pass between them. The tensor
// is shared, not owned: a copy of the model's parameter.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace engine {

struct NamedParameter {
  std::string name;
  at::Tensor tensor;
};

}  // namespace engine
