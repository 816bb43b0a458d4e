#include "hf_checkpoint.h"

#include <ATen/core/grad_mode.h>

#include <map>

#include "engine/atomic_file.h"
#include "engine/safetensors.h"

namespace engine::transformer {
namespace {

std::string Shape(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? "," : "") + std::to_string(sizes[i]);
  return out + "]";
}

bool Derived(const std::string& name) {
  return name.find("rotary_emb.inv_freq") != std::string::npos;
}

}  // namespace

StatusOr<nlohmann::json> ReadConfigJson(const std::filesystem::path& dir) {
  const auto path = dir / "config.json";
  ENGINE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError("'" + path.string() + "' is not valid JSON: " + e.what());
  }
}

Status LoadWeights(const std::filesystem::path& dir, torch::nn::Module& module,
                   const std::set<std::string>& optional) {
  // tensor name -> the file holding it
  std::map<std::string, std::filesystem::path> where;
  std::map<std::filesystem::path, std::shared_ptr<const safetensors::File>> files;
  const auto single = dir / "model.safetensors";
  const auto index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (std::filesystem::exists(index, ec)) {
    ENGINE_ASSIGN_OR_RETURN(std::string text, ReadFile(index));
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      return DataLossError("'" + index.string() + "' is not valid JSON: " + e.what());
    }
    auto map = json.find("weight_map");
    if (map == json.end() || !map->is_object()) {
      return DataLossError("'" + index.string() + "' has no weight_map");
    }
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (!it.value().is_string()) {
        return DataLossError("'" + index.string() + "': the shard of '" + it.key() +
                             "' is not a file name");
      }
      where[it.key()] = dir / it.value().get<std::string>();
    }
  } else if (std::filesystem::exists(single, ec)) {
    ENGINE_ASSIGN_OR_RETURN(auto file, safetensors::File::Open(single));
    files[single] = file;
    for (const auto& t : file->tensors()) where[t.name] = single;
  } else {
    return NotFoundError("'" + dir.string() +
                         "' holds neither model.safetensors nor model.safetensors.index.json");
  }

  std::map<std::string, at::Tensor> targets;
  for (auto& p : module.named_parameters(/*recurse=*/true)) targets[p.key()] = p.value();
  for (auto& b : module.named_buffers(/*recurse=*/true)) targets[b.key()] = b.value();
  for (const auto& [name, file] : where) {
    if (!targets.count(name) && !Derived(name)) {
      return InvalidArgumentError("'" + dir.string() + "' holds tensor '" + name +
                                  "', which this model does not have (another architecture or "
                                  "size?)");
    }
  }
  at::NoGradGuard no_grad;
  for (auto& [name, target] : targets) {
    auto it = where.find(name);
    if (it == where.end()) {
      if (optional.count(name)) continue;
      return NotFoundError("'" + dir.string() + "' has no tensor '" + name + "'");
    }
    auto& file = files[it->second];
    if (file == nullptr) {
      ENGINE_ASSIGN_OR_RETURN(file, safetensors::File::Open(it->second));
    }
    ENGINE_ASSIGN_OR_RETURN(at::Tensor stored, file->Get(name));
    if (!stored.sizes().equals(target.sizes())) {
      return InvalidArgumentError("'" + dir.string() + "': tensor '" + name + "' has shape " +
                                  Shape(stored.sizes()) + " but the model expects " +
                                  Shape(target.sizes()));
    }
    // The stored dtype is kept: the precision plan starts from what the checkpoint holds.
    target.set_data(stored.to(target.device()).clone());
  }
  return Status::Ok();
}

}  // namespace engine::transformer
