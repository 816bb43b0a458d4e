// Applying a stage's quantizer and adapters to its model's engine::Linear layers (engine/linear.h,
// engine/quantizer.h, engine/adapter.h), and what they did, for the plan.
//
// Quantization runs first (each matched layer's dense weight becomes the quantizer's format), then
// the adapters attach, in the stage's order, and the tensors their files hold whole replace the
// model's (AdapterPlugin::SavedModelTensors). Errors name the stage, the plugin, the pattern or the
// layer; the model is left part-way transformed only when an error is returned, and the caller
// then discards it.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/module_names.h"
#include "engine/status.h"
#include "pipeline/resolved_pipeline.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace engine {

class LinearImpl;
class QuantizedWeight;

struct LayerPluginReport {
  // Quantization.
  std::string quantized_format;  // "nf4"; empty without a quantizer
  int64_t quantized_layers = 0;
  int64_t quantized_parameters = 0;  // dense elements replaced
  int64_t quantized_bytes = 0;       // their storage, scales included
  // What their matmuls run in and why: "f32 (the stage's compute dtype)"; set by
  // SetQuantizedCompute.
  std::string quantized_compute;
  void Add(const QuantizedWeight& quantized, const LinearImpl& layer);
  double bits_per_parameter() const {
    return quantized_parameters > 0 ? 8.0 * quantized_bytes / quantized_parameters : 0.0;
  }
  // Adapters, per plugin in stage order.
  struct Adapter {
    std::string plugin;
    std::vector<std::string> layers;  // full names of the layers it sits on
    int64_t parameters = 0;
  };
  std::vector<Adapter> adapters;
  // Names of every adapter parameter (trainable by default).
  std::set<std::string> adapter_parameters;
  // The model's tensors an adapter's files held whole (AdapterPlugin::SavedModelTensors), whose
  // values they now hold; trainable by default, as the adapters.
  std::set<std::string> adapter_saved_tensors;
};

// An error's field path inside the pipeline (for its position) and message.
struct LayerPluginError {
  std::string path;
  std::string message;
};

// Returns the errors; empty on success. `module_prefixes` (the model's
// transformers_module_prefixes) gives each layer its module name, which adapters' target patterns
// may match and which adapter plugins are told; `base_dir` is the pipeline file's directory.
std::vector<LayerPluginError> ApplyLayerPlugins(const ResolvedStage& stage,
                                                torch::nn::Module& module,
                                                const ModulePrefixes& module_prefixes,
                                                const std::filesystem::path& base_dir,
                                                LayerPluginReport* report);

// Quantized layers multiply in the stage's compute dtype (`stage_compute`: its autocast dtype,
// else f32) unless the quantizer's options pin one with a `compute_dtype` field that is set; a
// quantizer without such a field keeps what its weights declare. Says which in `report`.
void SetQuantizedCompute(const ResolvedStage& stage, c10::ScalarType stage_compute,
                         torch::nn::Module& module, LayerPluginReport* report);

// The ModelContext::quantizes predicate for `stage`: whether its quantizer selects the layer of
// that full name. Empty for a stage without a quantizer.
std::function<bool(const std::string& name)> QuantizedLayers(const ResolvedStage& stage);

// The ModelContext::linear_loaded hook for `stage` (engine/model.h): quantizes each layer that
// `chosen` (QuantizedLayers' predicate) selects as soon as the loader has read its weight. A layer
// it cannot quantize stays dense, and ApplyLayerPlugins then reports the failure where the
// quantizer is configured. Empty when `chosen` is.
std::function<Status(const std::string& name, LinearImpl& layer)> QuantizeOnLoad(
    const ResolvedStage& stage, const std::function<bool(const std::string&)>& chosen);

// Whether target `pattern` selects the layer `name`: the whole name, or its last component.
bool TargetMatches(const std::string& pattern, const std::string& name);

}  // namespace engine
