// Loads a parent stage's final checkpoint into a child stage's freshly built (and possibly
// quantized and adapted) model, through the same tensor mapping `engine check` validated
// (plan/handoff.h): tensors copied as they are, dense weights quantized on the fly, the parent's
// LoRA adapters re-attached or, with `merge_adapters`, merged into the base weights first.
//
// Nothing is written into the model before the whole mapping is known to fit; errors name the
// checkpoint and start with `context`. Thread safety: the training thread, before training.
#pragma once

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/status.h"

namespace engine {

// `module` is the child's model, of `architecture` (for messages). `new_tensor_globs`: the stage's
// `new_tensors` (plan/handoff.h). The parent may be of another architecture when the tensors fit.
Status LoadParentWeights(const std::filesystem::path& dir, const std::string& context,
                         torch::nn::Module& module, const std::string& architecture,
                         const std::set<std::string>& child_adapter_parameters, bool merge_adapters,
                         const std::vector<std::string>& new_tensor_globs = {});

}  // namespace engine
