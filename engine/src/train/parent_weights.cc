#include "train/parent_weights.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/matmul.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_tensors.h"
#include "checkpoint/frozen_base.h"
#include "core/logging.h"
#include "core/module_tensors.h"
#include "engine/dtype.h"
#include "engine/linear.h"
#include "engine/safetensors.h"
#include "engine/untrusted_file.h"
#include "plan/handoff.h"

namespace engine {
namespace {

// alpha / r from a LoRA checkpoint's adapter_config.json (PEFT's keys).
StatusOr<double> LoraScale(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / kAdapterConfigFile;
  StatusOr<std::string> text = ReadUntrustedFile(path, FileKind::kConfig);
  if (!text.ok()) return text.status().WithContext("to merge its adapters");
  nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.contains("r") || !config.contains("lora_alpha") ||
      !config["r"].is_number() || !config["lora_alpha"].is_number() ||
      config["r"].get<double>() <= 0) {
    return DataLossError(path.string() + " lacks a positive 'r' and a 'lora_alpha'");
  }
  for (const char* key : {"use_rslora", "rank_pattern", "alpha_pattern"}) {
    auto it = config.find(key);
    if (it != config.end() && !it->is_null() && *it != false && !(it->is_object() && it->empty())) {
      return FailedPreconditionError(
          path.string() + " sets '" + key +
          "', so its layers are not all scaled by lora_alpha / r, which parent_adapters: MERGE "
          "folds in; ATTACH the adapters instead (the default)");
    }
  }
  return config["lora_alpha"].get<double>() / config["r"].get<double>();
}

// adapter_config.json's modules_to_save (PEFT's key): modules saved whole beside the adapters.
StatusOr<std::vector<std::string>> ModulesToSave(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / kAdapterConfigFile;
  StatusOr<std::string> text = ReadUntrustedFile(path, FileKind::kConfig);
  if (text.status().code() == StatusCode::kNotFound) return std::vector<std::string>();
  ENGINE_RETURN_IF_ERROR(text.status());
  nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return DataLossError(path.string() + " is not a JSON object");
  std::vector<std::string> modules;
  auto it = config.find("modules_to_save");
  if (it == config.end() || it->is_null()) return modules;
  if (!it->is_array()) return DataLossError(path.string() + ": modules_to_save is not a list");
  for (const auto& module : *it) {
    if (!module.is_string()) {
      return DataLossError(path.string() + ": modules_to_save holds a non-string");
    }
    modules.push_back(module.get<std::string>());
  }
  return modules;
}

// What the parent checkpoint in `dir` holds: its tensors, their shapes, which are integers, and the
// adapters beside them.
StatusOr<HandoffSource> DescribeParent(const std::filesystem::path& dir,
                                       const proto::CheckpointManifest& manifest,
                                       const CheckpointTensors& file) {
  HandoffSource source;
  source.stage = manifest.stage();
  for (const safetensors::TensorInfo& info : file.tensors()) {
    source.tensors[info.name] = info.shape;
    if (!c10::isFloatingType(info.dtype)) source.integer_tensors.insert(info.name);
  }
  // A slim checkpoint's base tensors, as its manifest lists them.
  for (const proto::TensorInfo& info : manifest.frozen_base().tensor()) {
    source.tensors[info.name()] = {info.shape().begin(), info.shape().end()};
    const std::optional<at::ScalarType> dtype = DtypeFromSafetensorsName(info.dtype());
    if (!dtype || !c10::isFloatingType(*dtype)) source.integer_tensors.insert(info.name());
  }
  if (std::filesystem::exists(dir / kAdapterFile)) {
    ENGINE_ASSIGN_OR_RETURN(auto adapters, safetensors::File::Open(dir / kAdapterFile));
    ENGINE_ASSIGN_OR_RETURN(const std::vector<std::string> saved_modules, ModulesToSave(dir));
    for (const safetensors::TensorInfo& info : adapters->tensors()) {
      if (info.name.rfind(kPeftPrefix, 0) != 0) continue;
      const std::string name = info.name.substr(std::strlen(kPeftPrefix));
      // The trained modules PEFT saves beside the adapters are not adapters.
      const bool saved_module =
          std::any_of(saved_modules.begin(), saved_modules.end(),
                      [&](const std::string& module) { return name.rfind(module + ".", 0) == 0; });
      if (!saved_module) source.adapter_tensors.insert(name);
    }
  }
  return source;
}

// Copies the tensors the handoff keeps as they are, but those the child already holds (`kept`: its
// own build of the base, and what its adapters' files gave it).
Status CopyTensors(const Handoff& handoff, const CheckpointTensors& file,
                   const std::set<std::string>& kept, torch::nn::Module& module) {
  std::map<std::string, at::Tensor> targets;
  for (ModuleTensor& t : ModuleTensors(module)) targets[t.name] = t.tensor;
  for (const std::string& name : handoff.copied) {
    if (kept.count(name) != 0) continue;
    ENGINE_ASSIGN_OR_RETURN(at::Tensor source_tensor, file.Get(name));
    targets.at(name).copy_(source_tensor);
  }
  return Status::Ok();
}

// Loads each dense layer's weight, with the parent's adapter merged in (W + scale * B A) where the
// handoff merges it, so the layer may quantize it.
Status LoadDenseLayers(const Handoff& handoff, const std::filesystem::path& dir,
                       const CheckpointTensors& file, torch::nn::Module& module) {
  double merge_scale = 0;
  std::shared_ptr<const safetensors::File> parent_adapters;
  if (!handoff.merged_adapters.empty()) {
    ENGINE_ASSIGN_OR_RETURN(merge_scale, LoraScale(dir));
    ENGINE_ASSIGN_OR_RETURN(parent_adapters, safetensors::File::Open(dir / kAdapterFile));
  }
  const std::string adapter_prefix = kPeftPrefix;
  std::map<std::string, std::shared_ptr<LinearImpl>> layers;
  for (auto& [name, layer] : NamedLinears(module)) layers[name] = layer;
  for (const std::string& name : handoff.dense_layers) {
    ENGINE_ASSIGN_OR_RETURN(at::Tensor dense, file.Get(name + ".weight"));
    dense = dense.to(at::kFloat);
    if (handoff.merged_adapters.count(name) != 0) {
      ENGINE_ASSIGN_OR_RETURN(at::Tensor a,
                              parent_adapters->Get(adapter_prefix + name + ".lora_A.weight"));
      ENGINE_ASSIGN_OR_RETURN(at::Tensor b,
                              parent_adapters->Get(adapter_prefix + name + ".lora_B.weight"));
      dense = dense + at::matmul(b.to(at::kFloat), a.to(at::kFloat)) * merge_scale;
    }
    ENGINE_RETURN_IF_ERROR(
        layers.at(name)->LoadDenseWeight(dense).WithContext("layer '" + name + "'"));
  }
  return Status::Ok();
}

// With a slim parent: checks that the child builds the base the parent was trained on, and returns
// the base's tensor names (the child's own tensors of those names stay as built).
StatusOr<std::set<std::string>> SharedBase(const proto::CheckpointManifest& manifest,
                                           const ParentLoad& load) {
  if (!manifest.has_frozen_base()) return std::set<std::string>();
  const proto::FrozenBase& recorded = manifest.frozen_base();
  StatusOr<const proto::FrozenBase*> own =
      load.own_base ? load.own_base()
                    : StatusOr<const proto::FrozenBase*>(FailedPreconditionError(
                          "this stage's model reads no `pretrained` directory"));
  const std::string slim = "its checkpoint holds only what stage '" + manifest.stage() +
                           "' changed over the base read from '" + recorded.pretrained() + "'";
  if (!own.ok()) {
    return FailedPreconditionError(
        slim + ", and this stage cannot build that base: " + own.status().message() +
        " (set checkpoint { self_contained: true } on stage '" + manifest.stage() +
        "' and train it again)");
  }
  ENGINE_RETURN_IF_ERROR(CheckSameBase(recorded, **own, slim));
  return BaseTensorNames(recorded);
}

}  // namespace

StatusOr<std::set<std::string>> LoadParentWeights(torch::nn::Module& module,
                                                  const ParentLoad& load) {
  const std::string where = load.context + ": starting from '" + load.dir.string() + "'";
  ENGINE_ASSIGN_OR_RETURN(proto::CheckpointManifest manifest,
                          ReadManifest(load.dir).WithContext(where));
  if (!manifest.final()) {
    return FailedPreconditionError(where + ": that checkpoint is not a finished stage's");
  }
  ENGINE_ASSIGN_OR_RETURN(CheckpointTensors file,
                          CheckpointTensors::Open(load.dir, manifest).WithContext(where));
  ENGINE_ASSIGN_OR_RETURN(std::set<std::string> base,
                          SharedBase(manifest, load).WithContext(where));
  ENGINE_ASSIGN_OR_RETURN(HandoffSource source,
                          DescribeParent(load.dir, manifest, file).WithContext(where));
  const Handoff handoff = PlanHandoff(source, module, load.child_adapter_parameters,
                                      load.merge_adapters, load.new_tensor_globs);
  const std::string parent_model = "'" + manifest.model().architecture() + "' model";
  if (!handoff.problems.empty()) {
    return FailedPreconditionError(where + ": its " + parent_model +
                                   " does not fit this stage's '" + load.architecture +
                                   "' model: " + HandoffProblems(handoff));
  }
  for (const std::string& layer : handoff.dense_layers) {
    if (base.count(layer + ".weight") != 0) {
      return FailedPreconditionError(where + ": layer '" + layer +
                                     "' would be built from the parent's base weight, which its "
                                     "checkpoint leaves out");
    }
  }
  at::NoGradGuard no_grad;
  std::set<std::string> kept = base;
  kept.insert(load.child_own_tensors.begin(), load.child_own_tensors.end());
  ENGINE_RETURN_IF_ERROR(CopyTensors(handoff, file, kept, module).WithContext(where));
  ENGINE_RETURN_IF_ERROR(LoadDenseLayers(handoff, load.dir, file, module).WithContext(where));
  LOG(INFO) << where << " (a " << parent_model << "): " << HandoffSummary(handoff)
            << (base.empty() ? ""
                             : "; its " + std::to_string(base.size()) +
                                   " base tensors are this stage's own build of the same base");
  return base;
}

}  // namespace engine
