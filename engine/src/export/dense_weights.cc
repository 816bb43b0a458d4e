#include "export/dense_weights.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/nn/module.h>

#include <map>
#include <set>

#include "engine/linear.h"
#include "engine/module_tensors.h"

namespace engine {
namespace {

at::Tensor MergedWeight(LinearImpl& layer) {
  at::Tensor weight = layer.DenseWeight(at::kFloat).cpu();
  for (const auto& adapter : layer.adapters()) {
    weight += adapter->WeightDelta().detach().to(at::kFloat).cpu();
  }
  return weight;
}

}  // namespace

StatusOr<safetensors::NamedTensors> DenseWeights(torch::nn::Module& module, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  // Exact f32 arithmetic, whatever autocast the caller's precision context has on.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
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
    for (const auto& adapter : layer->adapters()) {
      for (const auto& [child, sub] : adapter->modules()) {
        for (const auto& p : sub->named_parameters(/*recurse=*/true)) {
          dropped.insert(name + "." + child + "." + p.key());
        }
        for (const auto& b : sub->named_buffers(/*recurse=*/true)) {
          dropped.insert(name + "." + child + "." + b.key());
        }
      }
    }
  }
  safetensors::NamedTensors out;
  std::set<std::string> written;
  auto add = [&](const std::string& name, const at::Tensor& tensor) {
    const at::Tensor cpu = tensor.detach().cpu();
    out.emplace_back(name, at::isFloatingType(cpu.scalar_type()) ? cpu.to(dtype).contiguous()
                                                                 : cpu.contiguous());
    written.insert(name);
  };
  for (const ModuleTensor& t : ModuleTensors(module)) {
    auto layer = merged.find(t.name);
    if (layer != merged.end()) {
      if (!written.count(t.name)) add(t.name, MergedWeight(*layer->second));
    } else if (!dropped.count(t.name)) {
      add(t.name, t.tensor);
    }
  }
  // A quantized layer's codes may be stored under another name than "weight".
  for (const auto& [name, layer] : merged) {
    if (!written.count(name)) add(name, MergedWeight(*layer));
  }
  return out;
}

}  // namespace engine
