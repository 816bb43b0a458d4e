#include "export/dense_weights.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <set>

#include "core/module_tensors.h"
#include "engine/linear.h"

namespace engine {

at::Tensor ExportedTensor(const at::Tensor& tensor, at::ScalarType dtype) {
  const at::Tensor cpu = tensor.detach().cpu();
  return at::isFloatingType(cpu.scalar_type()) ? cpu.to(dtype).contiguous() : cpu.contiguous();
}

StatusOr<safetensors::NamedTensors> DenseWeights(torch::nn::Module& module, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  // Layer weights that differ from the stored tensor of that name, and the tensors that go.
  std::map<std::string, std::shared_ptr<LinearImpl>> merged;
  std::set<std::string> dropped;
  for (const auto& [name, layer] : NamedLinears(module)) {
    if (layer->merged()) {
      return FailedPreconditionError("layer '" + name +
                                     "' has its adapters merged already; unmerge them first");
    }
    if (layer->quantized() == nullptr && layer->adapters().empty()) continue;
    merged[name + ".weight"] = layer;
    if (layer->quantized() != nullptr) {
      for (const auto& [tensor, value] : layer->quantized()->tensors()) {
        dropped.insert(name + "." + tensor);
      }
    }
    for (const std::string& tensor : layer->AdapterTensorNames())
      dropped.insert(name + "." + tensor);
  }
  safetensors::NamedTensors out;
  std::set<std::string> written;
  auto add = [&](const std::string& name, const at::Tensor& tensor) {
    out.emplace_back(name, ExportedTensor(tensor, dtype));
    written.insert(name);
  };
  for (const ModuleTensor& t : ModuleTensors(module)) {
    auto layer = merged.find(t.name);
    if (layer != merged.end()) {
      if (!written.count(t.name)) add(t.name, layer->second->MergedWeight());
    } else if (!dropped.count(t.name)) {
      add(t.name, t.tensor);
    }
  }
  // A quantized layer's codes may be stored under another name than "weight".
  for (const auto& [name, layer] : merged) {
    if (!written.count(name)) add(name, layer->MergedWeight());
  }
  return out;
}

}  // namespace engine
