#include "plan/handoff.h"

#include "core/glob.h"
#include "engine/format.h"
#include "engine/linear.h"
#include "engine/module_tensors.h"

namespace engine {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

// The layer an adapter tensor sits on: "<layer>.lora_A.weight" -> "<layer>" when <layer> is one of
// `layers`; empty when none is.
std::string LayerOf(const std::string& tensor, const std::map<std::string, LinearImpl*>& layers) {
  for (size_t dot = tensor.rfind('.'); dot != std::string::npos && dot > 0;
       dot = tensor.rfind('.', dot - 1)) {
    const std::string prefix = tensor.substr(0, dot);
    if (layers.count(prefix)) return prefix;
  }
  return "";
}

// Whether `tensor` matches one of `globs`, counting the hits of each.
bool MarkNewTensor(const std::string& tensor, const std::vector<std::string>& globs,
                   std::vector<int64_t>& hits) {
  bool any = false;
  for (size_t i = 0; i < globs.size(); ++i) {
    if (GlobMatch(globs[i], tensor)) {
      ++hits[i];
      any = true;
    }
  }
  return any;
}

}  // namespace

Handoff PlanHandoff(const HandoffSource& parent, torch::nn::Module& child,
                    const std::set<std::string>& child_adapter_parameters, bool merge_adapters,
                    const std::vector<std::string>& new_tensor_globs) {
  Handoff h;
  std::map<std::string, std::vector<int64_t>> mine;
  for (const ModuleTensor& t : ModuleTensors(child)) mine[t.name] = t.tensor.sizes().vec();
  std::map<std::string, LinearImpl*> layers;
  auto named_linears = NamedLinears(child);
  for (auto& [name, layer] : named_linears) layers[name] = layer.get();

  std::vector<int64_t> glob_hits(new_tensor_globs.size(), 0);
  int64_t child_only_problem = -1;  // the first "exists only here", which carries the hint
  std::set<std::string> handled;    // child tensors
  std::set<std::string> consumed;   // parent tensors

  // The parent's adapters: merged into their layer's base weight, or re-attached by name below.
  std::map<std::string, std::vector<std::string>> to_merge;
  if (merge_adapters) {
    for (const std::string& tensor : parent.adapter_tensors) {
      const std::string layer = LayerOf(tensor, layers);
      const std::string leaf = layer.empty() ? "" : tensor.substr(layer.size() + 1);
      if (layer.empty() || (leaf != "lora_A.weight" && leaf != "lora_B.weight")) {
        h.problems.push_back("the parent's adapter tensor '" + tensor +
                             "' cannot be merged (only LoRA lora_A/lora_B weights on this model's "
                             "linear layers can)");
        continue;
      }
      to_merge[layer].push_back(tensor);
      consumed.insert(tensor);
    }
  }

  for (const auto& [name, layer] : layers) {
    const bool quantized = layer->quantized() != nullptr;
    const bool merging = to_merge.count(name) > 0;
    if (!quantized && !merging) continue;
    const std::vector<int64_t> dense = {layer->out_features(), layer->in_features()};
    std::vector<std::string> base_tensors;  // the child's tensors that hold the base weight
    if (quantized) {
      for (const auto& [buffer, tensor] : layer->quantized()->tensors()) {
        base_tensors.push_back(name + "." + buffer);
      }
    } else {
      base_tensors.push_back(name + ".weight");
    }
    const std::string weight = name + ".weight";
    auto it = parent.tensors.find(weight);
    if (it != parent.tensors.end() && it->second == dense &&
        !parent.integer_tensors.count(weight)) {
      h.dense_layers.push_back(name);
      if (quantized) ++h.quantized_layers;
      if (merging) h.merged_adapters[name] = to_merge[name];
      consumed.insert(weight);
      handled.insert(base_tensors.begin(), base_tensors.end());
      continue;
    }
    if (merging) {
      h.problems.push_back("'" + weight + "': merging the parent's adapters needs its dense " +
                           ShapeText(dense) + " weight, and the parent has " +
                           (it == parent.tensors.end() ? "none" : ShapeText(it->second)));
      handled.insert(base_tensors.begin(), base_tensors.end());
    }
    // Otherwise a parent quantized the same way matches tensor by tensor, below.
  }

  for (const auto& [name, shape] : mine) {
    if (handled.count(name)) continue;
    auto it = parent.tensors.find(name);
    if (it != parent.tensors.end()) {
      consumed.insert(name);
      if (it->second == shape) {
        h.copied.push_back(name);
        if (parent.adapter_tensors.count(name)) ++h.reattached_adapter_tensors;
      } else {
        h.problems.push_back("'" + name + "' is " + ShapeText(it->second) + " in '" + parent.stage +
                             "' but " + ShapeText(shape) + " here");
      }
    } else if (child_adapter_parameters.count(name)) {
      h.fresh.push_back(name);
      MarkNewTensor(name, new_tensor_globs, glob_hits);
    } else if (MarkNewTensor(name, new_tensor_globs, glob_hits)) {
      h.initialised.push_back(name);
    } else {
      if (child_only_problem < 0) child_only_problem = static_cast<int64_t>(h.problems.size());
      h.problems.push_back("'" + name + "' exists only here");
    }
  }
  if (child_only_problem >= 0) {
    h.problems[child_only_problem] +=
        " (name the tensors that keep the model's initialisation in new_tensors)";
  }
  for (size_t i = 0; i < new_tensor_globs.size(); ++i) {
    if (glob_hits[i] == 0) {
      h.problems.push_back("new_tensors pattern '" + new_tensor_globs[i] +
                           "' matches no tensor that '" + parent.stage + "' lacks");
    }
  }
  for (const auto& [name, shape] : parent.tensors) {
    if (consumed.count(name)) continue;
    if (parent.adapter_tensors.count(name)) {
      h.problems.push_back("the parent's adapter tensor '" + name +
                           "' has no place here: attach the same adapter to this stage, or set "
                           "parent_adapters: MERGE to fold it into the base weights");
    } else {
      h.problems.push_back("'" + name + "' exists only in '" + parent.stage + "'");
    }
  }
  return h;
}

std::string HandoffSummary(const Handoff& h) {
  std::string out = WithThousands(static_cast<int64_t>(h.copied.size())) + " tensors copied";
  if (h.quantized_layers > 0) {
    out += ", " + WithThousands(h.quantized_layers) + " layers quantized from dense weights";
  }
  const int64_t dense_only = static_cast<int64_t>(h.dense_layers.size()) - h.quantized_layers;
  if (dense_only > 0) out += ", " + WithThousands(dense_only) + " dense layers loaded";
  if (!h.merged_adapters.empty()) {
    out += ", the adapters of " + WithThousands(static_cast<int64_t>(h.merged_adapters.size())) +
           " layers merged";
  }
  if (h.reattached_adapter_tensors > 0) {
    out += ", " + WithThousands(h.reattached_adapter_tensors) + " adapter tensors re-attached";
  }
  if (!h.fresh.empty()) {
    out += ", " + WithThousands(static_cast<int64_t>(h.fresh.size())) + " new adapter tensors";
  }
  if (!h.initialised.empty()) {
    out += ", " + WithThousands(static_cast<int64_t>(h.initialised.size())) +
           " new tensors initialised by the model";
  }
  return out;
}

std::string HandoffProblems(const Handoff& h, size_t limit) {
  std::string out;
  for (size_t i = 0; i < h.problems.size() && i < limit; ++i)
    out += (i ? "; " : "") + h.problems[i];
  if (h.problems.size() > limit) {
    out += "; ... (" + std::to_string(h.problems.size()) + " in all)";
  }
  return out;
}

}  // namespace engine
