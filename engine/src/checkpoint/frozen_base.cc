#include "checkpoint/frozen_base.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <regex>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_layout.h"
#include "core/file_hash.h"
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

// The model options' `pretrained:"DIR";` in a recipe (their canonical text), as the pipeline wrote
// it; the first, which is the top-level option's (nested options come after their own field name).
const std::regex& PretrainedInRecipe() {
  static const std::regex kPretrained(R"(pretrained:"(?:[^"\\]|\\.)*";)");
  return kPretrained;
}

// A recipe without the model's `pretrained` directory: the files' contents name the base, wherever
// they are.
std::string RecipeWithoutPaths(const std::string& recipe) {
  return std::regex_replace(recipe, PretrainedInRecipe(), "",
                            std::regex_constants::format_first_only);
}

std::string WrittenPretrained(const std::string& recipe) {
  std::smatch match;
  return std::regex_search(recipe, match, PretrainedInRecipe()) ? match.str() : std::string();
}

// The regular files of `dir` (none when it cannot be listed), never throwing.
std::vector<std::filesystem::path> RegularFiles(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_error;
    if (it->is_regular_file(type_error)) files.push_back(it->path());
  }
  return files;
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
      ": the base it was trained on is not there. Put its files back as they were (or name where "
      "they are now with --base_path), or train the stage again on this base (`engine run` does)";
  const std::string trained_on = "it was trained on the base read from '" + recorded.pretrained() +
                                 "' (" + DescribeBaseFiles(recorded) + ")";
  std::map<std::string, const proto::FileDigest*> now;
  for (const proto::FileDigest& file : current.file()) now[file.name()] = &file;
  for (const proto::FileDigest& file : recorded.file()) {
    const std::string path = current.pretrained() + "/" + file.name();
    auto it = now.find(file.name());
    if (it == now.end()) {
      return FailedPreconditionError(context + ": " + trained_on + ", and '" + path +
                                     "' is missing" + what_to_do);
    }
    if (it->second->size() != file.size() || it->second->xxh3() != file.xxh3()) {
      return FailedPreconditionError(context + ": " + trained_on + ", and '" + path +
                                     "' differs (content hash " + it->second->xxh3() + ", then " +
                                     file.xxh3() + ")" + what_to_do);
    }
    now.erase(it);
  }
  if (!now.empty()) {
    return FailedPreconditionError(context + ": " + trained_on + ", and '" + current.pretrained() +
                                   "/" + now.begin()->first + "' is new since" + what_to_do);
  }
  if (RecipeWithoutPaths(recorded.recipe()) != RecipeWithoutPaths(current.recipe())) {
    return FailedPreconditionError(context + ": its base was built as [" + recorded.recipe() +
                                   "], this stage builds [" + current.recipe() + "]");
  }
  return Status::Ok();
}

bool HoldsBaseFiles(const std::filesystem::path& dir, const proto::FrozenBase& recorded) {
  size_t tensor_files = 0;
  for (const std::filesystem::path& file : RegularFiles(dir)) {
    if (MakesTensors(file.filename().string())) ++tensor_files;
  }
  if (tensor_files != static_cast<size_t>(recorded.file_size())) return false;
  std::error_code ec;
  for (const proto::FileDigest& file : recorded.file()) {
    const uintmax_t size = std::filesystem::file_size(dir / file.name(), ec);
    if (ec || size != file.size()) return false;
  }
  for (const proto::FileDigest& file : recorded.file()) {
    // A file that cannot be read is not the base's.
    StatusOr<std::string> hash = FileContentHash(dir / file.name());
    if (!hash.ok() || *hash != file.xxh3()) return false;
  }
  return true;
}

bool HoldsBaseFileNames(const std::filesystem::path& dir, const proto::FrozenBase& recorded) {
  std::error_code ec;
  for (const proto::FileDigest& file : recorded.file()) {
    if (!std::filesystem::is_regular_file(dir / file.name(), ec)) return false;
  }
  return true;
}

bool WrittenAsRecorded(const proto::FrozenBase& recorded, const ResolvedStage& stage) {
  const std::string written = WrittenPretrained(recorded.recipe());
  return !written.empty() && written == WrittenPretrained(BaseRecipe(stage));
}

namespace {

// Depth-first under `root` in name order, `depth` levels down at most: the first directory that
// holds the base's files, or an empty path. `visited` counts against kMaxBaseSearchDirs.
std::filesystem::path SearchBelow(const std::filesystem::path& root, int depth,
                                  const proto::FrozenBase& recorded, int* visited) {
  if (++*visited > kMaxBaseSearchDirs) return std::filesystem::path();
  if (HoldsBaseFiles(root, recorded)) return root;
  if (depth == 0) return std::filesystem::path();
  std::vector<std::filesystem::path> children;
  std::error_code ec;
  std::filesystem::directory_iterator it(root, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_error;
    if (it->is_directory(type_error) && !it->is_symlink(type_error)) children.push_back(it->path());
  }
  std::sort(children.begin(), children.end());
  for (const std::filesystem::path& child : children) {
    std::filesystem::path found = SearchBelow(child, depth - 1, recorded, visited);
    if (!found.empty()) return found;
  }
  return std::filesystem::path();
}

}  // namespace

StatusOr<std::filesystem::path> FindBaseByContent(const proto::FrozenBase& recorded,
                                                  const std::vector<std::filesystem::path>& roots) {
  int visited = 0;
  std::string looked;
  for (const std::filesystem::path& root : roots) {
    looked += (looked.empty() ? "'" : ", '") + root.string() + "'";
    std::error_code ec;
    if (!std::filesystem::is_directory(root, ec)) continue;
    std::filesystem::path found = SearchBelow(root, /*depth=*/3, recorded, &visited);
    if (!found.empty()) return found;
  }
  return NotFoundError(
      "no directory holds the base it was trained on (" + DescribeBaseFiles(recorded) +
      (looked.empty()
           ? std::string("); no other directory to look in was given")
           : "); looked in " + looked + " and the directories below them, 3 levels down") +
      (visited > kMaxBaseSearchDirs
           ? " (stopped after " + std::to_string(kMaxBaseSearchDirs) + " directories)"
           : std::string()) +
      ". Name the directory that holds it with --base_path=DIR or $ENGINE_BASE_PATH");
}

std::string DescribeBaseFiles(const proto::FrozenBase& base) {
  constexpr int kNamed = 4;
  std::string text;
  for (int i = 0; i < base.file_size() && i < kNamed; ++i) {
    const proto::FileDigest& file = base.file(i);
    text += (i == 0 ? "" : ", ") + file.name() + " (xxh3 " + file.xxh3() + ", " +
            std::to_string(file.size()) + " bytes)";
  }
  if (base.file_size() > kNamed) {
    text += " and " + std::to_string(base.file_size() - kNamed) + " more files";
  }
  return text;
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

Status StageFrozenBase::Fix(torch::nn::Module& module, const std::set<std::string>* parent_base,
                            const std::set<std::string>& not_base) {
  with_tensors_.reset();
  if (!slim_) return Status::Ok();
  std::set<std::string> names = UntrainedTensorNames(module);
  for (const std::string& name : not_base) names.erase(name);
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
