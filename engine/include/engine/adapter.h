// Adapter plugins (LoRA, ...): small trainable side paths attached to a model's linear layers.
//
// After quantization the engine finds every engine::Linear (engine/linear.h) that a target pattern
// matches (as for quantizers, the whole name or its last component; unlike theirs, the name may be
// the layer's checkpoint name or its module name, below) and attaches what Create returns. With
// adapters and no `trainable.include`, only adapter parameters train. Their names sit under the
// layer
// ("model.layers.0.self_attn.q_proj.lora_A.weight"), and their dtype follows the precision plan
// like any parameter's (f32 masters).
//
// When a stage ends, the engine writes `adapter_model.safetensors` (the adapter parameters under
// "base_model.model.<name>", as PEFT names them) and the plugin's `adapter_config.json` beside the
// full checkpoint. A pattern that matches no layer is an error. targets and Create run on the
// training thread, after the engine has seeded LibTorch's generator, so initialisation is
// reproducible. Errors are values naming the file, field or tensor; the engine adds the layer.
//
// An adapter read from files may also hold whole tensors of the model that were trained beside it
// (PEFT's modules_to_save and biases): SavedModelTensors returns them, the engine puts their values
// into the model's tensors of those names (same shapes) and trains them with the adapters.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/linear.h"
#include "engine/plugin.h"
#include "engine/safetensors.h"

namespace engine {

struct AdapterContext {
  // Relative paths in the options resolve against this directory (the pipeline file's).
  std::filesystem::path base_dir;
};

// The layer an adapter is created for, by both of its names.
struct AdapterSite {
  // As the checkpoint names its tensors: "model.layers.0.self_attn.q_proj".
  std::string name;
  // As Hugging Face's model class names the module, which is what PEFT's target_modules,
  // rank_pattern and alpha_pattern match and its adapter files are keyed by (transformers 5's
  // Qwen2-VL: "model.language_model.layers.0.self_attn.q_proj"); most models: `name`.
  std::string module_name;
};

class AdapterPlugin : public Plugin {
 public:
  PluginKind kind() const final { return PluginKind::kAdapter; }

  // Glob patterns over layer names; none: every layer.
  virtual StatusOr<std::vector<std::string>> targets(const google::protobuf::Message& options,
                                                     const AdapterContext& context) const = 0;
  // The option the patterns come from, for messages ("target_modules").
  virtual std::string targets_field(const google::protobuf::Message& options) const {
    (void)options;
    return "target_modules";
  }

  // An adapter for `layer` (its in_features and out_features; the layer may be quantized).
  virtual StatusOr<std::shared_ptr<LinearAdapter>> Create(const google::protobuf::Message& options,
                                                          const AdapterContext& context,
                                                          const AdapterSite& site,
                                                          const LinearImpl& layer) const = 0;

  // adapter_config.json for an adapter-only checkpoint of these layers (their full names).
  virtual StatusOr<std::string> AdapterConfigJson(const google::protobuf::Message& options,
                                                  const AdapterContext& context,
                                                  const std::vector<std::string>& layers) const = 0;

  // Whole tensors of the model the stage starts from and trains beside the adapters, named as
  // transformers names them ("lm_head.weight", "model.layers.0.self_attn.q_proj.bias"). Called once
  // per stage build, after Create; none by default.
  virtual StatusOr<safetensors::NamedTensors> SavedModelTensors(
      const google::protobuf::Message& options, const AdapterContext& context) const {
    (void)options;
    (void)context;
    return safetensors::NamedTensors();
  }
};

}  // namespace engine
