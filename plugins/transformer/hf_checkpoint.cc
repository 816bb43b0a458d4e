#include "hf_checkpoint.h"

#include <ATen/core/grad_mode.h>

#include <map>

#include "bnb4_checkpoint.h"
#include "engine/host_memory.h"
#include "engine/linear.h"
#include "engine/safetensors.h"
#include "engine/untrusted_file.h"

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
  return ReadJsonFile(dir / "config.json");
}

StatusOr<nlohmann::json> ReadJsonFile(const std::filesystem::path& path) {
  ENGINE_ASSIGN_OR_RETURN(std::string text, ReadUntrustedFile(path, FileKind::kConfig));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError("'" + path.string() + "' is not valid JSON: " + e.what());
  }
}

namespace {

using LinearLoaded = std::function<Status(const std::string&, LinearImpl&)>;

using Shards = std::map<std::filesystem::path, std::shared_ptr<const safetensors::File>>;

// The directory's weights: which file holds each tensor (the index's weight_map, or the single
// file's tensors), and every such file opened once.
struct Checkpoint {
  std::map<std::string, std::filesystem::path> where;  // tensor name -> its file
  std::map<std::string, std::string> stored;           // renamed tensors: name -> name in its file
  Shards files;

  const std::string& StoredName(const std::string& name) const {
    auto it = stored.find(name);
    return it == stored.end() ? name : it->second;
  }
  bool Has(const std::string& name) const { return where.count(name) != 0; }
  // Gives back the pages of tensor `name` (ReadInto has copied it).
  void Release(const std::string& name) const {
    if (auto it = where.find(name); it != where.end()) {
      files.at(it->second)->ReleasePages(StoredName(name));
    }
  }
  StatusOr<at::Tensor> Get(const std::string& name) const {
    auto it = where.find(name);
    if (it == where.end()) return NotFoundError("no tensor '" + name + "'");
    return files.at(it->second)->Get(StoredName(name));
  }
};

// Tensors whose names start with a renamed prefix take the module's prefix instead.
void RenamePrefixes(const PrefixRenames& renames, Checkpoint* checkpoint) {
  std::map<std::string, std::filesystem::path> where;
  for (const auto& [name, file] : checkpoint->where) {
    std::string module_name = name;
    for (const auto& [stored_prefix, module_prefix] : renames) {
      if (name.compare(0, stored_prefix.size(), stored_prefix) == 0) {
        module_name = module_prefix + name.substr(stored_prefix.size());
        checkpoint->stored[module_name] = name;
        break;
      }
    }
    where[module_name] = file;
  }
  checkpoint->where = std::move(where);
}

StatusOr<Checkpoint> OpenCheckpoint(const std::filesystem::path& dir) {
  Checkpoint checkpoint;
  const auto single = dir / "model.safetensors";
  const auto index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (std::filesystem::exists(index, ec)) {
    ENGINE_ASSIGN_OR_RETURN(std::string text, ReadUntrustedFile(index, FileKind::kConfig));
    const auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded()) return DataLossError("'" + index.string() + "' is not valid JSON");
    auto map = json.is_object() ? json.find("weight_map") : json.end();
    if (map == json.end() || !map->is_object()) {
      return DataLossError("'" + index.string() + "' has no weight_map");
    }
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (!it.value().is_string()) {
        return DataLossError("'" + index.string() + "': the shard of '" + it.key() +
                             "' is not a file name");
      }
      checkpoint.where[it.key()] = dir / it.value().get<std::string>();
    }
  } else if (std::filesystem::exists(single, ec)) {
    ENGINE_ASSIGN_OR_RETURN(checkpoint.files[single], safetensors::File::Open(single));
    for (const auto& t : checkpoint.files[single]->tensors()) checkpoint.where[t.name] = single;
  } else {
    return NotFoundError("'" + dir.string() +
                         "' holds neither model.safetensors nor model.safetensors.index.json");
  }
  for (const auto& [name, path] : checkpoint.where) {
    auto& file = checkpoint.files[path];
    if (file == nullptr) {
      ENGINE_ASSIGN_OR_RETURN(file, safetensors::File::Open(path));
    }
  }
  return checkpoint;
}

// Every tensor of the directory must be one of the module's (or derived from its config).
Status CheckNoUnknownTensors(const std::filesystem::path& dir,
                             const std::map<std::string, std::filesystem::path>& where,
                             const std::map<std::string, at::Tensor>& targets) {
  const auto has = [&where](const std::string& name) { return where.count(name) != 0; };
  for (const auto& [name, file] : where) {
    if (!targets.count(name) && !Derived(name) && !IsBnb4Companion(name, has)) {
      return InvalidArgumentError("'" + dir.string() + "' holds tensor '" + name +
                                  "', which this model does not have (another architecture or "
                                  "size?)");
    }
  }
  return Status::Ok();
}

// Whether checkpoint tensor `name`, of this shape and dtype, can take `target`'s place.
Status CheckPlaceable(const std::filesystem::path& dir, const std::string& name,
                      at::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& target) {
  if (!sizes.equals(target.sizes())) {
    return InvalidArgumentError("'" + dir.string() + "': tensor '" + name + "' has shape " +
                                Shape(sizes) + " but the model expects " + Shape(target.sizes()));
  }
  if (!at::isFloatingType(dtype)) {
    return InvalidArgumentError("'" + dir.string() + "': tensor '" + name + "' is stored as " +
                                std::string(c10::toString(dtype)) +
                                ", but the model's is a floating-point tensor");
  }
  return Status::Ok();
}

// Puts `stored` (checkpoint tensor `name`) into `target`, keeping the stored dtype.
Status Place(const std::filesystem::path& dir, const std::string& name, const at::Tensor& stored,
             at::Tensor& target) {
  ENGINE_RETURN_IF_ERROR(CheckPlaceable(dir, name, stored.sizes(), stored.scalar_type(), target));
  at::NoGradGuard no_grad;
  // The stored dtype is kept: the precision plan starts from what the checkpoint holds.
  if (target.scalar_type() == stored.scalar_type() && target.is_contiguous()) {
    target.copy_(stored);
  } else {
    target.set_data(stored.to(target.device()).clone());
  }
  return Status::Ok();
}

// Reads one tensor into `target`, keeping the stored dtype, and gives the file's pages for it back
// so that reading a checkpoint holds one copy of it, not two. A bitsandbytes 4-bit weight is read
// as the dense weight bitsandbytes dequantizes it to (bnb4_checkpoint.h).
Status ReadInto(const std::filesystem::path& dir, const Checkpoint& checkpoint,
                const std::string& name, at::Tensor& target) {
  const safetensors::File& file = *checkpoint.files.at(checkpoint.where.at(name));
  const std::string& stored_name = checkpoint.StoredName(name);
  if (checkpoint.Has(name + kBnb4StateSuffix)) {
    ENGINE_ASSIGN_OR_RETURN(
        at::Tensor dense,
        DequantizeBnb4(
            name, target.sizes(), [&](const std::string& n) { return checkpoint.Get(n); },
            "'" + dir.string() + "'"));
    ENGINE_RETURN_IF_ERROR(Place(dir, name, dense, target));
    checkpoint.Release(name);
    for (const char* part : {".absmax", ".nested_absmax"}) checkpoint.Release(name + part);
    return Status::Ok();
  }
  ENGINE_ASSIGN_OR_RETURN(at::Tensor stored, file.Get(stored_name));
  ENGINE_RETURN_IF_ERROR(Place(dir, stored_name, stored, target));
  file.ReleasePages(stored_name);
  return Status::Ok();
}

// What ReadInto does, from the file's header alone, for a tensor of a model that is only planned
// (ModelContext::plan_only): `target` becomes a tensor of the stored shape and dtype whose values
// are not read. Those of a layer the stage quantizes (`draw`) are drawn from N(0, 0.02) for its
// quantizer, which needs finite ones and packs them one layer at a time; the others stay undrawn.
// A bitsandbytes 4-bit weight, whose dense dtype its quantization state holds, is read as ReadInto
// reads it.
Status PlanInto(const std::filesystem::path& dir, const Checkpoint& checkpoint,
                const std::string& name, bool draw, at::Tensor& target) {
  if (checkpoint.Has(name + kBnb4StateSuffix)) return ReadInto(dir, checkpoint, name, target);
  const safetensors::File& file = *checkpoint.files.at(checkpoint.where.at(name));
  const std::string& stored_name = checkpoint.StoredName(name);
  const safetensors::TensorInfo* info = file.Find(stored_name);
  if (info == nullptr) {
    return NotFoundError("'" + file.path().string() + "' has no tensor '" + stored_name + "'");
  }
  ENGINE_RETURN_IF_ERROR(CheckPlaceable(dir, stored_name, info->shape, info->dtype, target));
  at::NoGradGuard no_grad;
  at::Tensor planned;
  if (draw) {
    // Drawn in f32 and cast: LibTorch's bf16 normal_ on a CPU takes 4.5x as long as both.
    planned = at::empty(info->shape, target.options().dtype(at::kFloat))
                  .normal_(0.0, 0.02)
                  .to(info->dtype);
  } else {
    planned = at::empty(info->shape, target.options().dtype(info->dtype));
  }
  target.set_data(planned);
  return Status::Ok();
}

// Bytes the loaded model will hold: each tensor as stored, a quantized layer's weight at about
// 4.2 bits per element (NF4 with its scales; int8 layers take more, but by then the estimate only
// has to be right about what cannot fit).
int64_t LoadedBytes(const Checkpoint& checkpoint, const std::set<std::string>& quantized) {
  int64_t bytes = 0;
  for (const auto& [name, path] : checkpoint.where) {
    const safetensors::TensorInfo* info = checkpoint.files.at(path)->Find(name);
    if (info == nullptr) continue;  // reported when it is read
    if (!quantized.count(name)) {
      bytes += static_cast<int64_t>(info->end - info->begin);
    } else {
      int64_t elements = 1;
      for (int64_t d : info->shape) elements *= d;
      bytes += elements * 21 / 40;
    }
  }
  return bytes;
}

// Refuses a load the host cannot hold, before it starts.
Status CheckMemory(const std::filesystem::path& dir, int64_t needed) {
  const std::optional<int64_t> available = AvailableHostMemory();
  if (!available || needed <= *available) return Status::Ok();
  return FailedPreconditionError(
      "'" + dir.string() + "': loading it needs about " + MemoryText(needed) +
      " (its tensors as stored, quantized layers at 4 bits) and this machine has " +
      MemoryText(*available) +
      " available (MemAvailable + SwapFree, within the cgroup's limit; ENGINE_AVAILABLE_MEMORY "
      "overrides); quantize more of it, or use a machine with more memory");
}

}  // namespace

Status LoadWeights(const std::filesystem::path& dir, torch::nn::Module& module,
                   const std::set<std::string>& optional, const ModelContext* context,
                   const PrefixRenames& renames) {
  ENGINE_ASSIGN_OR_RETURN(Checkpoint checkpoint, OpenCheckpoint(dir));
  RenamePrefixes(renames, &checkpoint);
  std::map<std::string, at::Tensor> targets;
  for (auto& p : module.named_parameters(/*recurse=*/true)) targets[p.key()] = p.value();
  for (auto& b : module.named_buffers(/*recurse=*/true)) targets[b.key()] = b.value();
  ENGINE_RETURN_IF_ERROR(CheckNoUnknownTensors(dir, checkpoint.where, targets));
  // weight tensor name -> its layer
  std::map<std::string, std::pair<std::string, std::shared_ptr<LinearImpl>>> linears;
  for (auto& [name, layer] : NamedLinears(module)) linears[name + ".weight"] = {name, layer};
  std::set<std::string> quantized;
  if (context != nullptr && context->quantizes) {
    for (const auto& [weight, layer] : linears) {
      if (context->quantizes(layer.first)) quantized.insert(weight);
    }
  }
  ENGINE_RETURN_IF_ERROR(CheckMemory(dir, LoadedBytes(checkpoint, quantized)));
  const LinearLoaded no_hook;
  const LinearLoaded& linear_loaded = context != nullptr ? context->linear_loaded : no_hook;
  for (auto& [name, target] : targets) {
    auto it = checkpoint.where.find(name);
    if (it == checkpoint.where.end()) {
      if (optional.count(name)) continue;
      return NotFoundError("'" + dir.string() + "' has no tensor '" + name + "'");
    }
    if (context != nullptr && context->plan_only) {
      ENGINE_RETURN_IF_ERROR(PlanInto(dir, checkpoint, name, quantized.count(name) > 0, target));
    } else {
      ENGINE_RETURN_IF_ERROR(ReadInto(dir, checkpoint, name, target));
    }
    // Let go of our handle, so that a layer quantized by the hook frees its dense weight now.
    target = at::Tensor();
    if (auto layer = linears.find(name); linear_loaded && layer != linears.end()) {
      ENGINE_RETURN_IF_ERROR(linear_loaded(layer->second.first, *layer->second.second));
    }
  }
  return Status::Ok();
}

}  // namespace engine::transformer
