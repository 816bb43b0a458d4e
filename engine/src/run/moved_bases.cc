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
  if (auto it = found_.find(pretrained_dir); it != found_.end()) {
    if (auto missing = missing_.find(pretrained_dir); missing != missing_.end()) {
      AddMissing(pipeline, stage, pretrained_dir, missing->second);
    }
    return it->second;
  }
  const std::optional<proto::FrozenBase> recorded =
      RecordedBase(pipeline, stage, search_.checkpoint);
  if (!recorded) return std::nullopt;
  std::optional<fs::path>& found = found_[pretrained_dir];
  StatusOr<bool> holds = HoldsBaseFiles(pretrained_dir, *recorded);
  if (holds.ok() && *holds) return found;
  std::vector<fs::path> roots;
  const fs::path then = fs::path(recorded->pretrained()).lexically_normal();
  if (then != pretrained_dir) roots.push_back(then);
  roots.insert(roots.end(), search_.dirs.begin(), search_.dirs.end());
  StatusOr<fs::path> base = FindBaseByContent(*recorded, roots);
  if (!base.ok()) {
    missing_[pretrained_dir] = base.status();
    AddMissing(pipeline, stage, pretrained_dir, base.status());
    return found;
  }
  found = *base;
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
