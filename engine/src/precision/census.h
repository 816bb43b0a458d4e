// The dtype census: every parameter and buffer of a module as it really is (failure catalogue F1),
// grouped by module group and role for the plan.
//
// The census reads the tensors themselves. A model-level "dtype" attribute, a wrapper's declared
// precision or the first parameter's dtype are never consulted: a wrapped model whose weights are
// bf16 shows bf16 here whatever it says about itself.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/precision.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace engine {

// "model.layers.3.mlp.up_proj.weight" -> "model.layers"; "visual.blocks.0.qkv" -> "visual";
// "lm_head.weight" -> "lm_head". The first component, or the first two when the first is a generic
// container (model, module, base_model, transformer, encoder, decoder).
std::string ModuleGroupOf(std::string_view name);

// Parameters (trainable = requires_grad), then buffers, in module order.
ParameterCensus TakeCensus(const torch::nn::Module& module);

struct CensusRow {
  std::string group;
  std::string role;  // "trainable", "frozen", "buffer"
  at::ScalarType dtype = at::kFloat;
  int64_t tensors = 0;
  int64_t elements = 0;
  int64_t bytes = 0;
};

// One row per (group, role, dtype), in first-seen order. With a plan, tensors it keeps in f32 get
// the role "<role>, kept f32".
std::vector<CensusRow> SummarizeCensus(const ParameterCensus& census,
                                       const PrecisionPlan* plan = nullptr);

}  // namespace engine
