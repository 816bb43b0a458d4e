// A stage's adapters as PEFT reads them: adapter_model.safetensors and adapter_config.json, for
// its checkpoints and for `engine export --format peft`.
//
//   - every adapter tensor, as "base_model.model." + its name in the model;
//   - modules_to_save: every module holding a trained parameter that is not an adapter's (a
//     projector, a norm), with all of that module's tensors, so that PEFT on the base computes
//     what the stage computes;
//   - base_model_name_or_path: the base the adapters go on (PeftBaseModel's unless given), null
//     when there is none.
//
// The adapter plugin writes the rest of adapter_config.json (r, lora_alpha, target_modules from
// the full names of the adapted layers, ...). Errors name the stage and plugin. Reads the module
// only.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "core/module_names.h"
#include "engine/safetensors.h"
#include "engine/status.h"
#include "pipeline/resolved_pipeline.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace engine {

struct PeftAdapterFiles {
  safetensors::NamedTensors tensors;  // adapter_model.safetensors
  std::string config_json;            // adapter_config.json
};

// The base the stage's adapters go on, for base_model_name_or_path: its model's `pretrained`
// directory; else, for a stage started from another, that stage's final checkpoint when it is a
// plain model directory (its manifest names no adapter or quantizer); else empty.
std::filesystem::path PeftBaseModel(const ResolvedStage& stage, const ResolvedPipeline& pipeline);

// Fails when the stage has no adapters. `module_prefixes` (Model::transformers_module_prefixes)
// renames the tensors, modules_to_save and adapted layers for PEFT on transformers' model class;
// a stage's own checkpoints keep the model's names (none), which the engine reads back.
// `base_dir`: the pipeline's directory, against which the adapter plugin resolves its options.
StatusOr<PeftAdapterFiles> MakePeftAdapterFiles(const ResolvedStage& stage,
                                                torch::nn::Module& module,
                                                const std::string& base_model,
                                                const ModulePrefixes& module_prefixes,
                                                const std::filesystem::path& base_dir);

}  // namespace engine
