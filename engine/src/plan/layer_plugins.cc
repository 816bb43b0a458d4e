#include "plan/layer_plugins.h"

#include <ATen/ATen.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <torch/nn/module.h>

#include <map>
#include <optional>

#include "core/allocator.h"
#include "core/glob.h"
#include "core/guarded_call.h"
#include "core/module_names.h"
#include "engine/adapter.h"
#include "engine/dtype.h"
#include "engine/linear.h"
#include "engine/quantizer.h"

namespace engine {
namespace {

using Linears = std::vector<std::pair<std::string, std::shared_ptr<LinearImpl>>>;

std::string ExampleLayers(const Linears& linears) {
  std::string out;
  const size_t n = std::min<size_t>(linears.size(), 3);
  for (size_t i = 0; i < n; ++i) out += (i ? ", '" : "'") + linears[i].first + "'";
  if (linears.size() > n) out += ", ... (" + std::to_string(linears.size()) + " layers)";
  return out;
}

// The layers `patterns` select (all of them for no pattern), or errors for patterns that select
// nothing. With `module_prefixes`, a pattern may also match a layer's transformers module name.
Linears Select(const ResolvedPluginRef& ref, const std::vector<std::string>& patterns,
               const std::string& field, const Linears& linears,
               std::vector<LayerPluginError>* errors, const ModulePrefixes& module_prefixes = {}) {
  if (linears.empty()) {
    errors->push_back({ref.path, ref.context +
                                     ": the model has no engine::Linear layer to act on (its "
                                     "plugin builds its layers some other way)"});
    return {};
  }
  Linears selected;
  std::vector<int> hits(patterns.size(), 0);
  for (const auto& item : linears) {
    bool chosen = patterns.empty();
    const std::string module_name = TransformersModuleName(item.first, module_prefixes);
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (TargetMatches(patterns[i], item.first) || TargetMatches(patterns[i], module_name)) {
        chosen = true;
        ++hits[i];
      }
    }
    if (chosen) selected.push_back(item);
  }
  for (size_t i = 0; i < patterns.size(); ++i) {
    if (const std::string syntax = GlobSyntaxError(patterns[i]); !syntax.empty()) {
      errors->push_back({ref.path + ".options",
                         ref.context + ": " + field + " pattern '" + patterns[i] + "': " + syntax});
    } else if (hits[i] == 0) {
      errors->push_back({ref.path + ".options", ref.context + ": " + field + " pattern '" +
                                                    patterns[i] +
                                                    "' matches no linear layer; they are named "
                                                    "like " +
                                                    ExampleLayers(linears)});
    }
  }
  return selected;
}

// The layers the plugin's target patterns select, its patterns asked behind the guard.
using Patterns = std::pair<std::vector<std::string>, std::string>;  // and their field

Linears SelectTargets(const ResolvedPluginRef& ref, const StatusOr<Patterns>& patterns,
                      const Linears& linears, std::vector<LayerPluginError>* errors,
                      const ModulePrefixes& module_prefixes = {}) {
  if (!patterns.ok()) {
    errors->push_back({ref.path, patterns.status().message()});
    return {};
  }
  return Select(ref, patterns->first, patterns->second, linears, errors, module_prefixes);
}

StatusOr<Patterns> QuantizerTargets(const ResolvedPluginRef& ref, const QuantizerPlugin& plugin) {
  return GuardedCall(ref.context, [&]() -> StatusOr<Patterns> {
    return Patterns(plugin.targets(*ref.options), plugin.targets_field());
  });
}

StatusOr<Patterns> AdapterTargets(const ResolvedPluginRef& ref, const AdapterPlugin& plugin,
                                  const AdapterContext& context) {
  return GuardedCall(ref.context, [&]() -> StatusOr<Patterns> {
    ENGINE_ASSIGN_OR_RETURN(std::vector<std::string> patterns,
                            plugin.targets(*ref.options, context));
    return Patterns(std::move(patterns), plugin.targets_field(*ref.options));
  });
}

// Replaces `layer`'s dense weight by what the quantizer makes of it, adding it to `report`.
Status QuantizeLayer(const ResolvedPluginRef& ref, const QuantizerPlugin& plugin, LinearImpl& layer,
                     LayerPluginReport* report) {
  at::NoGradGuard no_grad;
  const at::Tensor dense = layer.weight.detach().cpu();
  ENGINE_ASSIGN_OR_RETURN(std::shared_ptr<QuantizedWeight> quantized,
                          plugin.Quantize(*ref.options, dense));
  ENGINE_RETURN_IF_ERROR(layer.Quantize(quantized));
  if (report != nullptr) report->Add(*quantized, layer);
  return Status::Ok();
}

// Puts the whole tensors the adapter's files hold into the model's tensors of those names (by
// transformers module name or the model's own), checking shapes, and records the model's names.
Status LoadSavedModelTensors(const ResolvedPluginRef& ref, const AdapterPlugin& plugin,
                             const AdapterContext& context, torch::nn::Module& module,
                             const ModulePrefixes& module_prefixes, std::set<std::string>* names) {
  ENGINE_ASSIGN_OR_RETURN(safetensors::NamedTensors saved, GuardedCall(ref.context, [&] {
                            return plugin.SavedModelTensors(*ref.options, context);
                          }));
  if (saved.empty()) return Status::Ok();
  std::map<std::string, std::pair<std::string, at::Tensor>> by_name;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    by_name[item.key()] = {item.key(), item.value()};
    by_name.emplace(TransformersModuleName(item.key(), module_prefixes),
                    std::make_pair(item.key(), item.value()));
  }
  for (const auto& [name, value] : saved) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return NotFoundError(ref.context + ": its files hold tensor '" + name +
                           "', which names no trainable tensor of the model (a quantized layer's "
                           "weight is none)");
    }
    at::Tensor& target = it->second.second;
    if (target.sizes() != value.sizes()) {
      return InvalidArgumentError(ref.context + ": its files hold tensor '" + name + "' as " +
                                  c10::str(value.sizes()) + ", but the model's is " +
                                  c10::str(target.sizes()));
    }
    target.copy_(value.to(target.scalar_type()));
    names->insert(it->second.first);
  }
  return Status::Ok();
}

}  // namespace

void LayerPluginReport::Add(const QuantizedWeight& quantized, const LinearImpl& layer) {
  quantized_format = quantized.format();
  ++quantized_layers;
  quantized_parameters += layer.in_features() * layer.out_features();
  quantized_bytes += quantized.storage_bytes();
}

void SetQuantizedCompute(const ResolvedStage& stage, c10::ScalarType stage_compute,
                         torch::nn::Module& module, LayerPluginReport* report) {
  if (stage.quantizer.entry == nullptr) return;
  const google::protobuf::Message& options = *stage.quantizer.options;
  const google::protobuf::FieldDescriptor* field =
      options.GetDescriptor()->FindFieldByName("compute_dtype");
  const bool open = field != nullptr && field->has_presence() &&
                    !options.GetReflection()->HasField(options, field);
  std::optional<c10::ScalarType> declared;
  for (const auto& [name, layer] : NamedLinears(module)) {
    if (layer->quantized() == nullptr) continue;
    if (open) layer->SetQuantizedComputeDtype(stage_compute);
    declared = layer->quantized_compute_dtype();
  }
  if (!declared) return;
  std::string why = " (the quantizer's)";
  if (open) {
    why = " (the stage's compute dtype; options.compute_dtype pins another)";
  } else if (field != nullptr) {
    why = " (options.compute_dtype)";
  }
  report->quantized_compute = std::string(DtypeShortName(*declared)) + why;
}

std::function<bool(const std::string&)> QuantizedLayers(const ResolvedStage& stage) {
  const ResolvedPluginRef& ref = stage.quantizer;
  if (ref.entry == nullptr) return {};
  const auto* plugin = static_cast<const QuantizerPlugin*>(ref.entry->plugin.get());
  StatusOr<std::vector<std::string>> patterns = GuardedCall(
      ref.context,
      [&]() -> StatusOr<std::vector<std::string>> { return plugin->targets(*ref.options); });
  if (!patterns.ok()) return {};  // ApplyLayerPlugins reports it
  return [patterns = *std::move(patterns)](const std::string& name) {
    if (patterns.empty()) return true;
    for (const std::string& pattern : patterns) {
      if (TargetMatches(pattern, name)) return true;
    }
    return false;
  };
}

std::function<Status(const std::string&, LinearImpl&)> QuantizeOnLoad(
    const ResolvedStage& stage, const std::function<bool(const std::string&)>& chosen) {
  if (!chosen) return {};
  const ResolvedPluginRef& ref = stage.quantizer;
  const auto* plugin = static_cast<const QuantizerPlugin*>(ref.entry->plugin.get());
  return [&ref, plugin, chosen](const std::string& name, LinearImpl& layer) -> Status {
    if (layer.quantized() != nullptr || !chosen(name)) return Status::Ok();
    // A failure leaves the layer dense for ApplyLayerPlugins to report with its position.
    (void)GuardedCall(ref.context, [&] { return QuantizeLayer(ref, *plugin, layer, nullptr); });
    // A checkpoint's layers are read in sizes that rarely fit the holes the dense weights leave.
    ReturnFreedMemory();
    return Status::Ok();
  };
}

bool TargetMatches(const std::string& pattern, const std::string& name) {
  if (GlobMatch(pattern, name)) return true;
  const size_t dot = name.rfind('.');
  return dot != std::string::npos && GlobMatch(pattern, std::string_view(name).substr(dot + 1));
}

std::vector<LayerPluginError> ApplyLayerPlugins(const ResolvedStage& stage,
                                                torch::nn::Module& module,
                                                const ModulePrefixes& module_prefixes,
                                                const std::filesystem::path& base_dir,
                                                LayerPluginReport* report) {
  std::vector<LayerPluginError> errors;
  if (stage.quantizer.entry == nullptr && stage.adapters.empty()) return errors;
  const Linears linears = NamedLinears(module);
  at::NoGradGuard no_grad;

  if (const ResolvedPluginRef& ref = stage.quantizer; ref.entry != nullptr) {
    const auto* plugin = static_cast<const QuantizerPlugin*>(ref.entry->plugin.get());
    const Linears selected = SelectTargets(ref, QuantizerTargets(ref, *plugin), linears, &errors);
    if (!errors.empty()) return errors;
    report->quantized_format.clear();
    for (const auto& [name, layer] : selected) {
      // Layers quantized while the checkpoint was read (QuantizeOnLoad) are only counted.
      if (layer->quantized() != nullptr) {
        report->Add(*layer->quantized(), *layer);
        continue;
      }
      // Everything the plugin's objects do, behind the guard.
      Status status = GuardedCall(ref.context + ": layer '" + name + "'",
                                  [&] { return QuantizeLayer(ref, *plugin, *layer, report); });
      if (!status.ok()) {
        errors.push_back({ref.path, status.message()});
        return errors;
      }
    }
  }

  for (const ResolvedPluginRef& ref : stage.adapters) {
    const auto* plugin = static_cast<const AdapterPlugin*>(ref.entry->plugin.get());
    const AdapterContext context{base_dir};
    const Linears selected = SelectTargets(ref, AdapterTargets(ref, *plugin, context), linears,
                                           &errors, module_prefixes);
    if (!errors.empty()) return errors;
    LayerPluginReport::Adapter summary;
    summary.plugin = ref.entry->name;
    for (const auto& [name, layer] : selected) {
      Status status = GuardedCall(ref.context + ": layer '" + name + "'", [&]() -> Status {
        const AdapterSite site{name, TransformersModuleName(name, module_prefixes)};
        ENGINE_ASSIGN_OR_RETURN(std::shared_ptr<LinearAdapter> adapter,
                                plugin->Create(*ref.options, context, site, *layer));
        ENGINE_RETURN_IF_ERROR(layer->AddAdapter(adapter));
        for (const auto& [child, sub] : adapter->modules()) {
          for (const auto& p : sub->named_parameters(/*recurse=*/true)) {
            report->adapter_parameters.insert(name + "." + child + "." + p.key());
            summary.parameters += p.value().numel();
          }
        }
        return Status::Ok();
      });
      if (!status.ok()) {
        errors.push_back({ref.path, status.message()});
        return errors;
      }
      summary.layers.push_back(name);
    }
    report->adapters.push_back(std::move(summary));
    if (Status saved = LoadSavedModelTensors(ref, *plugin, context, module, module_prefixes,
                                             &report->adapter_saved_tensors);
        !saved.ok()) {
      errors.push_back({ref.path, saved.message()});
      return errors;
    }
  }
  return errors;
}

}  // namespace engine
