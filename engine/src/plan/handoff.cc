#include "plan/handoff.h"

#include "core/glob.h"
#include "core/module_tensors.h"
#include "engine/format.h"
#include "engine/linear.h"

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

// One mapping worked out in steps, each adding to the handoff and to what is accounted for on both
// sides; whatever is left unaccounted at the end is a problem.
class HandoffPlanner {
 public:
  HandoffPlanner(const HandoffSource& parent, torch::nn::Module& child,
                 const std::set<std::string>& child_adapter_parameters,
                 const std::vector<std::string>& new_tensor_globs)
      : parent_(parent),
        child_adapter_parameters_(child_adapter_parameters),
        new_tensor_globs_(new_tensor_globs),
        glob_hits_(new_tensor_globs.size(), 0),
        linears_(NamedLinears(child)) {
    for (const ModuleTensor& t : ModuleTensors(child)) mine_[t.name] = t.tensor.sizes().vec();
    for (auto& [name, layer] : linears_) layers_[name] = layer.get();
  }

  Handoff Plan(bool merge_adapters) {
    if (merge_adapters) CollectAdaptersToMerge();
    MatchDenseLayers();
    MatchChildTensors();
    CheckNewTensorGlobs();
    ReportParentLeftovers();
    return std::move(h_);
  }

 private:
  // The parent's adapters that fold into their layer's base weight (the rest are re-attached by
  // name in MatchChildTensors).
  void CollectAdaptersToMerge() {
    for (const std::string& tensor : parent_.adapter_tensors) {
      const std::string layer = LayerOf(tensor, layers_);
      const std::string leaf = layer.empty() ? "" : tensor.substr(layer.size() + 1);
      if (layer.empty() || (leaf != "lora_A.weight" && leaf != "lora_B.weight")) {
        h_.problems.push_back("the parent's adapter tensor '" + tensor +
                              "' cannot be merged (only LoRA lora_A/lora_B weights on this "
                              "model's linear layers can)");
        continue;
      }
      to_merge_[layer].push_back(tensor);
      consumed_.insert(tensor);
    }
  }

  // Quantized or merging layers of the child, set from the parent's dense weight of their shape.
  void MatchDenseLayers() {
    for (const auto& [name, layer] : layers_) {
      const bool quantized = layer->quantized() != nullptr;
      const bool merging = to_merge_.count(name) > 0;
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
      auto it = parent_.tensors.find(weight);
      if (it != parent_.tensors.end() && it->second == dense &&
          !parent_.integer_tensors.count(weight)) {
        h_.dense_layers.push_back(name);
        if (quantized) ++h_.quantized_layers;
        if (merging) h_.merged_adapters[name] = to_merge_[name];
        consumed_.insert(weight);
        handled_.insert(base_tensors.begin(), base_tensors.end());
        continue;
      }
      if (merging && it != parent_.tensors.end() && parent_.integer_tensors.count(weight)) {
        h_.problems.push_back("'" + weight +
                              "': merging the parent's adapters needs its dense weight, and the "
                              "parent holds it quantized (" +
                              ShapeText(it->second) +
                              " codes): keep the adapters with parent_adapters: ATTACH, or train "
                              "the parent without a quantizer");
        handled_.insert(base_tensors.begin(), base_tensors.end());
      } else if (merging) {
        h_.problems.push_back("'" + weight + "': merging the parent's adapters needs its dense " +
                              ShapeText(dense) + " weight, and the parent has " +
                              (it == parent_.tensors.end() ? "none" : ShapeText(it->second)));
        handled_.insert(base_tensors.begin(), base_tensors.end());
      }
      // Otherwise a parent quantized the same way matches tensor by tensor, below.
    }
  }

  // Every other child tensor: copied by name and shape, or new (its own adapters, new_tensors).
  void MatchChildTensors() {
    int64_t child_only_problem = -1;  // the first "exists only here", which carries the hint
    for (const auto& [name, shape] : mine_) {
      if (handled_.count(name)) continue;
      auto it = parent_.tensors.find(name);
      if (it != parent_.tensors.end()) {
        consumed_.insert(name);
        if (it->second == shape) {
          h_.copied.push_back(name);
          if (parent_.adapter_tensors.count(name)) ++h_.reattached_adapter_tensors;
        } else {
          h_.problems.push_back("'" + name + "' is " + ShapeText(it->second) + " in '" +
                                parent_.stage + "' but " + ShapeText(shape) + " here");
        }
      } else if (child_adapter_parameters_.count(name)) {
        h_.fresh.push_back(name);
        MarkNewTensor(name, new_tensor_globs_, glob_hits_);
      } else if (MarkNewTensor(name, new_tensor_globs_, glob_hits_)) {
        h_.initialised.push_back(name);
      } else {
        if (child_only_problem < 0) child_only_problem = static_cast<int64_t>(h_.problems.size());
        h_.problems.push_back("'" + name + "' exists only here");
      }
    }
    if (child_only_problem >= 0) {
      h_.problems[child_only_problem] +=
          " (name the tensors that keep the model's initialisation in new_tensors)";
    }
  }

  void CheckNewTensorGlobs() {
    for (size_t i = 0; i < new_tensor_globs_.size(); ++i) {
      if (glob_hits_[i] == 0) {
        h_.problems.push_back("new_tensors pattern '" + new_tensor_globs_[i] +
                              "' matches no tensor that '" + parent_.stage + "' lacks");
      }
    }
  }

  void ReportParentLeftovers() {
    for (const auto& [name, shape] : parent_.tensors) {
      if (consumed_.count(name)) continue;
      if (parent_.adapter_tensors.count(name)) {
        h_.problems.push_back("the parent's adapter tensor '" + name +
                              "' has no place here: attach the same adapter to this stage, or set "
                              "parent_adapters: MERGE to fold it into the base weights");
      } else {
        h_.problems.push_back("'" + name + "' exists only in '" + parent_.stage + "'");
      }
    }
  }

  const HandoffSource& parent_;
  const std::set<std::string>& child_adapter_parameters_;
  const std::vector<std::string>& new_tensor_globs_;
  std::vector<int64_t> glob_hits_;
  std::vector<std::pair<std::string, std::shared_ptr<LinearImpl>>> linears_;  // keeps layers_ alive
  std::map<std::string, std::vector<int64_t>> mine_;  // the child's tensors and shapes
  std::map<std::string, LinearImpl*> layers_;
  std::map<std::string, std::vector<std::string>> to_merge_;  // layer -> parent adapter tensors
  std::set<std::string> handled_;                             // child tensors accounted for
  std::set<std::string> consumed_;                            // parent tensors accounted for
  Handoff h_;
};

}  // namespace

Handoff PlanHandoff(const HandoffSource& parent, torch::nn::Module& child,
                    const std::set<std::string>& child_adapter_parameters, bool merge_adapters,
                    const std::vector<std::string>& new_tensor_globs) {
  return HandoffPlanner(parent, child, child_adapter_parameters, new_tensor_globs)
      .Plan(merge_adapters);
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
