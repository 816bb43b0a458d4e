#include "core/module_tensors.h"

#include <torch/nn/module.h>

namespace engine {

std::vector<ModuleTensor> ModuleTensors(const torch::nn::Module& module) {
  std::vector<ModuleTensor> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out.push_back({item.key(), item.value(), false});
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    out.push_back({item.key(), item.value(), true});
  }
  return out;
}

}  // namespace engine
