// Adapter plugins (LoRA, ...): small trainable side paths attached to a model's linear layers.
//
// After quantization the engine finds every engine::Linear (engine/linear.h) whose name a target
// pattern matches (as for quantizers: the whole name or its last component) and attaches what
// Create returns. With adapters and no `trainable.include`, only adapter parameters train. Their
// names sit under the layer ("model.layers.0.self_attn.q_proj.lora_A.weight"), and their dtype
// follows the precision plan like any parameter's (f32 masters).
//
// When a stage ends, the engine writes `adapter_model.safetensors` (the adapter parameters under
// "base_model.model.<name>", as PEFT names them) and the plugin's `adapter_config.json` beside the
// full checkpoint. A pattern that matches no layer is an error. Create runs on the training thread,
// after the engine has seeded LibTorch's generator, so initialisation is reproducible.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/linear.h"
#include "engine/plugin.h"

namespace engine {

class AdapterPlugin : public Plugin {
 public:
  PluginKind kind() const final { return PluginKind::kAdapter; }

  virtual std::vector<std::string> targets(const google::protobuf::Message& options) const = 0;
  virtual std::string targets_field() const { return "target_modules"; }

  // An adapter for `layer` (its in_features and out_features; the layer may be quantized).
  virtual StatusOr<std::shared_ptr<LinearAdapter>> Create(const google::protobuf::Message& options,
                                                          const LinearImpl& layer) const = 0;

  // adapter_config.json for an adapter-only checkpoint of these layers (their full names).
  virtual std::string AdapterConfigJson(const google::protobuf::Message& options,
                                        const std::vector<std::string>& layers) const = 0;
};

}  // namespace engine
