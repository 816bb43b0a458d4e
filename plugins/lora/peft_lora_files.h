// A LoRA adapter that PEFT saved (save_pretrained: adapter_config.json beside
// adapter_model.safetensors), read so that a stage goes on training it and computes, before its
// first step, what PEFT computes with it.
//
// What PEFT's LoraConfig keys do here:
//   - r, lora_alpha, lora_dropout, use_rslora, rank_pattern, alpha_pattern: each layer's rank,
//     alpha and scale, as PEFT works them out (a pattern matches a module name when the name is
//     the pattern or ends in "." followed by it, as a regular expression; the file's first match
//     wins). The tensors' shapes must agree with the ranks.
//   - target_modules, exclude_modules, layers_to_transform, layers_pattern: which layers have
//     adapters; the tensors in adapter_model.safetensors say it exactly, so those are used.
//   - how the adapters were initialised (init_lora_weights true, false, "gaussian", "eva",
//     "orthogonal"; loftq_config, eva_config, corda_config, lora_ga_config), and bookkeeping
//     (task_type, peft_version, base_model_name_or_path, revision, inference_mode, auto_mapping,
//     runtime_config, ...): nothing to compute. init_lora_weights "pissa*", "olora", "corda",
//     "loftq", "lora_ga" and "mica" rewrite the base weights when PEFT loads the adapter: refused.
//   - modules_to_save, and bias "all" or "lora_only": whole tensors of the model saved beside the
//     adapters (a module's tensors; biases, PEFT's "<layer>.base_layer.bias" for a layer with an
//     adapter), which the stage starts from and trains (PeftSavedModelTensors).
//   - anything else that changes what is computed (use_dora, lora_bias, target_parameters,
//     trainable_token_indices, fan_in_fan_out, ...) and any key PEFT 0.21 does not have, when it
//     is set: refused, naming the key.
// Tensors other than "base_model.model.<module>.lora_A.weight" / ".lora_B.weight" and those saved
// tensors are refused by name, and so is a modules_to_save entry no tensor belongs to. The files
// are untrusted: adapter_config.json is read up to 16 MiB, patterns up to 1,000 characters, and
// every error names the file and the key or tensor. Pure functions of the files; any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "engine/safetensors.h"
#include "engine/status.h"

namespace engine::plugins {

inline constexpr char kPeftConfigFile[] = "adapter_config.json";
inline constexpr char kPeftWeightsFile[] = "adapter_model.safetensors";

struct PeftLoraConfig {
  std::filesystem::path file;  // for messages
  int64_t r = 8;
  double lora_alpha = 8;
  double lora_dropout = 0;
  bool use_rslora = false;
  std::vector<std::pair<std::string, int64_t>> rank_pattern;  // in the file's order
  std::vector<std::pair<std::string, double>> alpha_pattern;
  std::string task_type;
  std::vector<std::string> modules_to_save;
  std::string bias = "none";  // "none", "all" or "lora_only"

  // PEFT's rank, alpha and output scale for the module of this name.
  StatusOr<int64_t> RankOf(const std::string& module_name) const;
  StatusOr<double> AlphaOf(const std::string& module_name) const;
  StatusOr<double> ScaleOf(const std::string& module_name) const;
};

StatusOr<PeftLoraConfig> ReadPeftLoraConfig(const std::filesystem::path& dir);

// The modules adapter_model.safetensors holds adapters for (both lora_A and lora_B), in file order.
StatusOr<std::vector<std::string>> PeftAdaptedModules(const safetensors::File& weights,
                                                      const PeftLoraConfig& config);

// The whole tensors of the model adapter_model.safetensors holds beside the adapters
// (modules_to_save and biases), as transformers names them ("model.norm.weight"; "<layer>.bias" for
// PEFT's
// "<layer>.base_layer.bias"), in f32.
StatusOr<safetensors::NamedTensors> PeftSavedModelTensors(const safetensors::File& weights,
                                                          const PeftLoraConfig& config);

// The module's (lora_A [r, in], lora_B [out, r]) from adapter_model.safetensors, checked against
// the rank and the layer's sizes.
StatusOr<std::pair<at::Tensor, at::Tensor>> PeftLoraWeights(const safetensors::File& weights,
                                                            const std::string& module_name,
                                                            int64_t r, int64_t in_features,
                                                            int64_t out_features);

}  // namespace engine::plugins
