#include "checkpoint/frozen_base.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_layout.h"
#include "core/module_tensors.h"
#include "engine/linear.h"
#include "pipeline/pretrained_dir.h"

namespace engine {
namespace {

// The files of a pretrained directory that make its tensors: config.json and the safetensors
// weights with their index. The tokenizer's files make no tensor.
bool MakesTensors(const std::string& name) {
  auto ends_with = [&name](const std::string& tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return name == "config.json" || ends_with(".safetensors") || ends_with(".safetensors.index.json");
}

}  // namespace

StatusOr<proto::FrozenBase> DescribeFrozenBase(const ResolvedStage& stage,
                                               const ResolvedPipeline& pipeline) {
  const std::filesystem::path dir = StagePretrainedDir(stage, pipeline.base_dir);
  if (dir.empty()) {
    return FailedPreconditionError(stage.subject() + ": its model reads no `pretrained` directory");
  }
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& item : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = item.path().filename().string();
    if (item.is_regular_file(ec) && MakesTensors(name)) names.push_back(name);
  }
  if (ec) return IoError("cannot list '" + dir.string() + "': " + ec.message());
  std::sort(names.begin(), names.end());
  proto::FrozenBase base;
  base.set_pretrained(dir.string());
  base.set_recipe(BaseRecipe(stage));
  for (const std::string& name : names) {
    ENGINE_ASSIGN_OR_RETURN(*base.add_file(), DigestFile(dir / name, name));
  }
  return base;
}

std::set<std::string> UntrainedTensorNames(torch::nn::Module& module) {
  std::set<std::string> names;
  for (const ModuleTensor& t : ModuleTensors(module)) {
    if (!t.buffer && !t.tensor.requires_grad()) names.insert(t.name);
  }
  for (const auto& [layer_name, layer] : NamedLinears(module)) {
    if (layer->quantized() == nullptr) continue;
    for (const auto& [name, tensor] : layer->quantized()->tensors()) {
      names.insert(layer_name + "." + name);
    }
  }
  return names;
}

Status CheckSameBase(const proto::FrozenBase& recorded, const proto::FrozenBase& current,
                     const std::string& context) {
  const std::string what_to_do =
      ": the base it was trained on is no longer there. Put the directory back as it was, or "
      "train the stage again on it (`engine run` does)";
  if (recorded.pretrained() != current.pretrained()) {
    return FailedPreconditionError(context + ": it was trained on the base read from '" +
                                   recorded.pretrained() + "', this stage reads '" +
                                   current.pretrained() + "'" + what_to_do);
  }
  std::map<std::string, const proto::FileDigest*> now;
  for (const proto::FileDigest& file : current.file()) now[file.name()] = &file;
  for (const proto::FileDigest& file : recorded.file()) {
    const std::string path = recorded.pretrained() + "/" + file.name();
    auto it = now.find(file.name());
    if (it == now.end()) {
      return FailedPreconditionError(context + ": '" + path + "' is missing" + what_to_do);
    }
    if (it->second->size() != file.size() || it->second->xxh3() != file.xxh3()) {
      return FailedPreconditionError(context + ": '" + path + "' changed since (content hash " +
                                     it->second->xxh3() + ", then " + file.xxh3() + ")" +
                                     what_to_do);
    }
    now.erase(it);
  }
  if (!now.empty()) {
    return FailedPreconditionError(context + ": '" + recorded.pretrained() + "/" +
                                   now.begin()->first + "' is new since" + what_to_do);
  }
  if (recorded.recipe() != current.recipe()) {
    return FailedPreconditionError(context + ": its base was built as [" + recorded.recipe() +
                                   "], this stage builds [" + current.recipe() + "]");
  }
  return Status::Ok();
}

std::set<std::string> BaseTensorNames(const proto::FrozenBase& base) {
  std::set<std::string> names;
  for (const proto::TensorInfo& tensor : base.tensor()) names.insert(tensor.name());
  return names;
}

StatusOr<const proto::FrozenBase*> StageFrozenBase::Identity() {
  if (!identity_) {
    ENGINE_ASSIGN_OR_RETURN(identity_, DescribeFrozenBase(stage_, pipeline_));
  }
  return &*identity_;
}

Status StageFrozenBase::Fix(torch::nn::Module& module, const std::set<std::string>* parent_base) {
  with_tensors_.reset();
  if (!slim_) return Status::Ok();
  std::set<std::string> names = UntrainedTensorNames(module);
  if (parent_base != nullptr) {
    for (auto it = names.begin(); it != names.end();) {
      it = parent_base->count(*it) != 0 ? std::next(it) : names.erase(it);
    }
  }
  if (names.empty()) return Status::Ok();
  ENGINE_ASSIGN_OR_RETURN(const proto::FrozenBase* identity, Identity());
  proto::FrozenBase base = *identity;
  for (const ModuleTensor& t : ModuleTensors(module)) {
    if (names.count(t.name) != 0) *base.add_tensor() = DescribeTensor(t.name, t.tensor);
  }
  with_tensors_ = std::move(base);
  return Status::Ok();
}

}  // namespace engine
