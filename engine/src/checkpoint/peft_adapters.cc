#include "checkpoint/peft_adapters.h"

#include <torch/nn/module.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/checkpoint.h"
#include "core/guarded_call.h"
#include "core/module_names.h"
#include "core/module_tensors.h"
#include "engine/adapter.h"
#include "engine/linear.h"
#include "engine/plugin.h"
#include "pipeline/pretrained_dir.h"

namespace engine {
namespace {

struct AdapterLayout {
  std::vector<std::string> layers;  // full names of the layers with adapters
  std::set<std::string> tensors;    // full names of the adapter tensors
};

AdapterLayout FindAdapters(torch::nn::Module& module) {
  AdapterLayout layout;
  for (const auto& [name, layer] : NamedLinears(module)) {
    if (layer->adapters().empty()) continue;
    layout.layers.push_back(name);
    for (const std::string& tensor : layer->AdapterTensorNames()) {
      layout.tensors.insert(name + "." + tensor);
    }
  }
  return layout;
}

// The module that owns tensor `name` ("model.norm" for "model.norm.weight").
std::string OwningModule(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? "" : name.substr(0, dot);
}

}  // namespace

StatusOr<PeftAdapterFiles> MakePeftAdapterFiles(const ResolvedStage& stage,
                                                torch::nn::Module& module,
                                                const std::string& base_model,
                                                const ModulePrefixes& module_prefixes,
                                                const std::filesystem::path& base_dir) {
  const auto renamed = [&](const std::string& name) {
    return TransformersModuleName(name, module_prefixes);
  };
  if (stage.adapters.empty()) {
    return FailedPreconditionError(stage.subject() +
                                   " trains no adapters, so it has no PEFT adapter files");
  }
  const AdapterLayout layout = FindAdapters(module);
  const std::vector<ModuleTensor> tensors = ModuleTensors(module);
  // Trained tensors beside the adapters, by module: a module that trains only its bias goes as
  // PEFT's `bias` (under a layer with an adapter, as "<layer>.base_layer.bias"), any other as a
  // whole module in modules_to_save.
  std::map<std::string, std::set<std::string>> trained_by_module;
  for (const ModuleTensor& t : tensors) {
    if (!t.buffer && t.tensor.requires_grad() && layout.tensors.count(t.name) == 0) {
      trained_by_module[OwningModule(t.name)].insert(t.name.substr(t.name.rfind('.') + 1));
    }
  }
  const std::set<std::string> adapted(layout.layers.begin(), layout.layers.end());
  std::set<std::string> modules_to_save, bias_modules;
  bool bias_beyond_adapters = false;
  for (const auto& [owner, leaves] : trained_by_module) {
    if (leaves == std::set<std::string>{"bias"}) {
      bias_modules.insert(owner);
      bias_beyond_adapters = bias_beyond_adapters || adapted.count(owner) == 0;
    } else {
      modules_to_save.insert(renamed(owner));
    }
  }
  PeftAdapterFiles files;
  for (const ModuleTensor& t : tensors) {
    const std::string owner = OwningModule(t.name);
    if (layout.tensors.count(t.name) > 0 || modules_to_save.count(renamed(owner)) > 0) {
      files.tensors.emplace_back(kPeftPrefix + renamed(t.name), t.tensor.detach());
    } else if (bias_modules.count(owner) > 0 && t.name == owner + ".bias") {
      files.tensors.emplace_back(
          kPeftPrefix + renamed(owner) + (adapted.count(owner) ? ".base_layer.bias" : ".bias"),
          t.tensor.detach());
    }
  }
  auto layers = layout.layers;
  for (auto& layer : layers) layer = renamed(layer);
  const ResolvedPluginRef& ref = stage.adapters.front();
  const auto* plugin = static_cast<const AdapterPlugin*>(ref.entry->plugin.get());
  ENGINE_ASSIGN_OR_RETURN(
      std::string plugin_json, GuardedCall(ref.context, [&]() -> StatusOr<std::string> {
        return plugin->AdapterConfigJson(*ref.options, AdapterContext{base_dir}, layers);
      }));
  auto config = nlohmann::ordered_json::parse(plugin_json, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) {
    return InternalError(ref.context + ": its adapter_config.json is not a JSON object");
  }
  config["modules_to_save"] = modules_to_save.empty() ? nlohmann::ordered_json(nullptr)
                                                      : nlohmann::ordered_json(modules_to_save);
  config["bias"] = bias_modules.empty() ? "none" : bias_beyond_adapters ? "all" : "lora_only";
  config["base_model_name_or_path"] =
      base_model.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(base_model);
  files.config_json = config.dump(2) + "\n";
  return files;
}

std::filesystem::path PeftBaseModel(const ResolvedStage& stage, const ResolvedPipeline& pipeline) {
  std::filesystem::path pretrained = StagePretrainedDir(stage, pipeline.base_dir);
  if (!pretrained.empty() || !stage.from_stage) return pretrained;
  const std::filesystem::path parent =
      FinalCheckpointDir(pipeline.output_dir / pipeline.stages[*stage.from_stage].name);
  StatusOr<proto::CheckpointManifest> manifest = ReadManifest(parent);
  if (!manifest.ok()) return {};
  // A shard_level 3 stage's checkpoint holds the ranks' parts of its weights, not a model.
  StatusOr<std::vector<std::string>> weight_parts = RankFiles(*manifest, RankFile::kWeights);
  if (!weight_parts.ok() || !weight_parts->empty()) return {};
  for (const proto::PluginVersion& plugin : manifest->plugin()) {
    if (plugin.kind() == PluginKindName(PluginKind::kAdapter) ||
        plugin.kind() == PluginKindName(PluginKind::kQuantizer)) {
      return {};
    }
  }
  return parent;
}

}  // namespace engine
