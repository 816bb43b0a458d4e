#include "precision/census.h"

#include <torch/nn/module.h>

#include <map>
#include <set>
#include <tuple>

#include "core/module_tensors.h"

namespace engine {

std::string ModuleGroupOf(std::string_view name) {
  static const char* kContainers[] = {"model",       "module",  "base_model",
                                      "transformer", "encoder", "decoder"};
  const size_t first = name.find('.');
  if (first == std::string_view::npos) return std::string(name);
  const std::string_view head = name.substr(0, first);
  for (const char* container : kContainers) {
    if (head == container) {
      const size_t second = name.find('.', first + 1);
      // "model.norm.weight" -> "model.norm"; "model.x" (a tensor of the container) -> "model".
      if (second == std::string_view::npos) return std::string(head);
      return std::string(name.substr(0, second));
    }
  }
  return std::string(head);
}

ParameterCensus TakeCensus(const torch::nn::Module& module) {
  ParameterCensus census;
  for (const ModuleTensor& t : ModuleTensors(module)) {
    census.push_back({t.name, ModuleGroupOf(t.name), t.tensor.scalar_type(), t.tensor.numel(),
                      !t.buffer && t.tensor.requires_grad(), t.buffer});
  }
  return census;
}

std::vector<CensusRow> SummarizeCensus(const ParameterCensus& census, const PrecisionPlan* plan) {
  std::set<std::string> kept;
  if (plan != nullptr) {
    for (const TensorPlan& t : plan->tensors) {
      if (t.kept_fp32) kept.insert(t.name);
    }
  }
  std::vector<CensusRow> rows;
  std::map<std::tuple<std::string, std::string, at::ScalarType>, size_t> index;
  for (const TensorCensusEntry& t : census) {
    std::string role = t.is_buffer ? "buffer" : (t.trainable ? "trainable" : "frozen");
    if (kept.count(t.name)) role += ", kept f32";
    auto key = std::make_tuple(t.group, role, t.dtype);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, rows.size()).first;
      rows.push_back({t.group, role, t.dtype, 0, 0, 0});
    }
    CensusRow& row = rows[it->second];
    ++row.tensors;
    row.elements += t.numel;
    row.bytes += t.bytes();
  }
  return rows;
}

}  // namespace engine
