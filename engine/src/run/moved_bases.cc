#include "run/moved_bases.h"

#include <cstdlib>

#include "checkpoint/checkpoint.h"
#include "checkpoint/frozen_base.h"
#include "plugins/search_path.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

// The base recorded by the slim checkpoint `named` when it is `stage`'s, else by the stage's final
// checkpoint, else by its newest periodic one; nothing when the first readable one is not slim.
std::optional<proto::FrozenBase> RecordedBase(const ResolvedPipeline& pipeline,
                                              const ResolvedStage& stage, const fs::path& named) {
  const fs::path stage_dir = pipeline.output_dir / stage.name;
  std::vector<fs::path> dirs;
  if (!named.empty()) dirs.push_back(named);
  dirs.push_back(FinalCheckpointDir(stage_dir));
  const std::vector<fs::path> periodic = PeriodicCheckpointDirs(stage_dir);
  if (!periodic.empty()) dirs.push_back(periodic.back());
  for (const fs::path& dir : dirs) {
    std::error_code ec;
    if (!fs::exists(dir / kManifestFile, ec)) continue;
    StatusOr<proto::CheckpointManifest> manifest = ReadManifest(dir);
    if (!manifest.ok() || manifest->stage() != stage.name) continue;
    if (!manifest->has_frozen_base()) return std::nullopt;
    return manifest->frozen_base();
  }
  return std::nullopt;
}

}  // namespace

std::vector<fs::path> BaseSearchPath(const std::string& flag) {
  std::vector<fs::path> dirs = SplitPathList(flag);
  if (const char* env = std::getenv(kBaseSearchPathVariable)) {
    for (fs::path& dir : SplitPathList(env)) dirs.push_back(std::move(dir));
  }
  for (fs::path& dir : dirs) dir = fs::absolute(dir).lexically_normal();
  return dirs;
}

std::optional<fs::path> MovedBaseFinder::Find(const ResolvedPipeline& pipeline,
                                              const ResolvedStage& stage,
                                              const fs::path& pretrained_dir) {
  const std::optional<proto::FrozenBase> recorded =
      RecordedBase(pipeline, stage, search_.checkpoint);
  if (!recorded) {
    // A stage without a slim checkpoint (a child not trained yet) reads its directory where the
    // stages before it in the file found their base.
    auto moved = moved_dirs_.find(pretrained_dir);
    return moved == moved_dirs_.end() ? std::nullopt : std::optional<fs::path>(moved->second);
  }
  // Only a base that is gone is looked for. A directory holding files of the recorded names keeps
  // them, changed or not (a base changed in place trains the stage again), and a `pretrained` the
  // pipeline now writes otherwise than the checkpoint's model did is the user's new choice.
  if (HoldsBaseFileNames(pretrained_dir, *recorded) || !WrittenAsRecorded(*recorded, stage)) {
    return std::nullopt;
  }
  // By directory and content: stages reading one directory may record different bases.
  const std::string key = pretrained_dir.string() + "\n" + DescribeBaseFiles(*recorded);
  if (auto it = found_.find(key); it != found_.end()) {
    if (auto missing = missing_.find(key); missing != missing_.end()) {
      AddMissing(pipeline, stage, pretrained_dir, missing->second);
    }
    return it->second;
  }
  std::optional<fs::path>& found = found_[key];
  std::vector<fs::path> roots;
  const fs::path then = fs::path(recorded->pretrained()).lexically_normal();
  if (then != pretrained_dir) roots.push_back(then);
  roots.insert(roots.end(), search_.dirs.begin(), search_.dirs.end());
  StatusOr<fs::path> base = FindBaseByContent(*recorded, roots);
  if (!base.ok()) {
    missing_[key] = base.status();
    AddMissing(pipeline, stage, pretrained_dir, base.status());
    return found;
  }
  found = *base;
  moved_dirs_.emplace(pretrained_dir, *base);
  notes_.push_back(stage.subject() + ": its base is no longer in '" + pretrained_dir.string() +
                   "'; found by its content in '" + base->string() + "'");
  return found;
}

void MovedBaseFinder::AddMissing(const ResolvedPipeline& pipeline, const ResolvedStage& stage,
                                 const fs::path& pretrained_dir, const Status& why) {
  not_found_[stage.name] = {
      pipeline.Locate(stage.path() + ".model"),
      why.WithContext(stage.subject() + ": its slim checkpoint's base is not in '" +
                      pretrained_dir.string() + "'")};
}

}  // namespace engine
