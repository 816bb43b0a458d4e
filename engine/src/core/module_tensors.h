// Every tensor a module holds, by its full name: its parameters, then its buffers. This is the
// order and the naming of checkpoints (model.safetensors), the census and the handoff between
// stages, so everything that walks a model's state walks it through here.
//
// The tensors are the module's own (not copies): writing into them writes into the model.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace engine {

struct ModuleTensor {
  std::string name;
  at::Tensor tensor;
  bool buffer = false;  // a buffer (quantized codes, running statistics), not a parameter
};

std::vector<ModuleTensor> ModuleTensors(const torch::nn::Module& module);

}  // namespace engine
