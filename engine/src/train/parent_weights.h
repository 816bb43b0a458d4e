// Loads a parent stage's final checkpoint into a child stage's freshly built (and possibly
// quantized and adapted) model, through the same tensor mapping `engine check` validated
// (plan/handoff.h): tensors copied as they are, dense weights quantized on the fly, the parent's
// LoRA adapters re-attached or, with `merge_adapters`, merged into the base weights first.
//
// A slim parent (checkpoint/checkpoint_layout.h) holds only what it changed; its frozen base is the
// child's own build's, which must be the same base (checkpoint/frozen_base.h).
//
// Nothing is written into the model before the whole mapping is known to fit; errors name the
// checkpoint and start with `context`. Thread safety: the training thread, before training.
#pragma once

#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "engine/checkpoint.pb.h"
#include "engine/model.h"
#include "engine/status.h"

namespace engine {

struct ParentLoad {
  std::filesystem::path dir;  // the parent's final checkpoint
  std::string context;        // "stage 'x'"
  std::string architecture;   // the child's model's, for messages
  std::set<std::string> child_adapter_parameters;
  // Tensors the child's build took from elsewhere (the whole tensors its adapters' files hold,
  // plan/layer_plugins.h), which the parent's do not replace.
  std::set<std::string> child_own_tensors;
  bool merge_adapters = false;
  // The stage's `new_tensors` (plan/handoff.h).
  std::vector<std::string> new_tensor_globs;
  // The base the child builds from its own `pretrained` directory (checkpoint/frozen_base.h), asked
  // only when the parent's checkpoint is slim: its left-out base tensors are then the child's own,
  // once the two bases are checked equal. Null or an error: a slim parent cannot be loaded.
  std::function<StatusOr<const proto::FrozenBase*>()> own_base;
};

// `module` is the child's model. The parent may be of another architecture when the tensors fit.
// Returns the names of the parent's base tensors the child kept as its own build made them (empty
// for a parent whose checkpoint holds every tensor).
StatusOr<std::set<std::string>> LoadParentWeights(torch::nn::Module& module,
                                                  const ParentLoad& load);

}  // namespace engine
