#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <google/protobuf/text_format.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "core/atomic_file.h"
#include "core/file_hash.h"
#include "core/logging.h"
#include "core/remove_tree.h"
#include "engine/dtype.h"

namespace engine {
namespace {

constexpr const char* kPeriodicDir = "checkpoints";
constexpr const char* kPeriodicPrefix = "step-";
const char* RankFilePrefix(RankFile kind) {
  return kind == RankFile::kWeights ? "model-rank-" : "optimizer-rank-";
}

std::string HiddenTemporaryName(const std::filesystem::path& dir) {
  static int counter = 0;
  return "." + dir.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter++);
}

// Swaps `from` into `to`: atomic replacement when `to` exists (renameat2 RENAME_EXCHANGE), a plain
// rename otherwise. On success `from` names the old directory (or nothing).
Status Publish(const std::filesystem::path& from, const std::filesystem::path& to, bool* swapped) {
  *swapped = false;
  std::error_code ec;
  if (std::filesystem::exists(to, ec)) {
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) {
      *swapped = true;
      return Status::Ok();
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
      return IoError("cannot replace '" + to.string() + "': " + std::strerror(errno));
    }
    // No atomic exchange on this file system: move the old one aside first. A crash in between
    // leaves no directory under `to`, never a partial one.
    const std::filesystem::path aside =
        to.parent_path() /
        ("." + to.filename().string() + ".tmp-old-" + std::to_string(::getpid()));
    if (::rename(to.c_str(), aside.c_str()) != 0) {
      return IoError("cannot move '" + to.string() + "' aside: " + std::strerror(errno));
    }
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return IoError("cannot publish checkpoint '" + to.string() + "': " + std::strerror(errno));
    }
    RemoveTree(aside, ec);
    return Status::Ok();
  }
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return IoError("cannot publish checkpoint '" + to.string() + "': " + std::strerror(errno));
  }
  return Status::Ok();
}

// Records every file written so far into `temp` (all but the manifest) with its size and hash;
// those in `known` (the ranks' files, which each rank hashed) as recorded there.
Status RecordFileDigests(const std::filesystem::path& temp,
                         const std::vector<proto::FileDigest>& known,
                         proto::CheckpointManifest* manifest) {
  manifest->clear_file();
  std::map<std::string, const proto::FileDigest*> recorded;
  for (const proto::FileDigest& digest : known) recorded[digest.name()] = &digest;
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& item : std::filesystem::directory_iterator(temp, ec)) {
    const std::filesystem::path name = item.path().filename();
    if (item.is_regular_file(ec) && name != kManifestFile && name != kManifestHashFile) {
      files.push_back(item.path());
    }
  }
  if (ec) return IoError("cannot list '" + temp.string() + "': " + ec.message());
  std::sort(files.begin(), files.end());
  for (const std::filesystem::path& file : files) {
    auto it = recorded.find(file.filename().string());
    if (it != recorded.end()) {
      *manifest->add_file() = *it->second;
      continue;
    }
    ENGINE_ASSIGN_OR_RETURN(*manifest->add_file(), DigestFile(file, file.filename().string()));
  }
  return Status::Ok();
}

}  // namespace

namespace {

Status WriteContents(const std::filesystem::path& temp, CheckpointContents contents) {
  proto::CheckpointManifest& manifest = contents.manifest;
  manifest.set_format_version(!contents.staged_files.empty() ? kCheckpointFormatVersion
                              : manifest.has_frozen_base()   ? kSlimFormatVersion
                                                             : kSelfContainedFormatVersion);
  for (const proto::FileDigest& file : contents.staged_files) {
    const std::filesystem::path from = contents.staged_dir / file.name();
    if (::rename(from.c_str(), (temp / file.name()).c_str()) != 0) {
      return IoError("cannot move '" + from.string() +
                     "' into the checkpoint: " + std::strerror(errno));
    }
  }
  manifest.clear_tensor();
  for (const auto& [name, tensor] : contents.model) {
    *manifest.add_tensor() = DescribeTensor(name, tensor);
  }
  for (const proto::TensorInfo& info : contents.rank_file_tensors) *manifest.add_tensor() = info;
  safetensors::Metadata model_metadata = {
      {"format", "pt"}, {"stage", manifest.stage()}, {"step", std::to_string(manifest.step())}};
  ENGINE_RETURN_IF_ERROR(safetensors::Write(temp / kModelFile, contents.model, model_metadata));
  if (!contents.optimizer.empty()) {
    ENGINE_RETURN_IF_ERROR(
        safetensors::Write(temp / kOptimizerFile, contents.optimizer, contents.optimizer_metadata));
    manifest.mutable_optimizer()->set_state_file(kOptimizerFile);
  }
  if (!contents.adapters.empty()) {
    ENGINE_RETURN_IF_ERROR(
        safetensors::Write(temp / kAdapterFile, contents.adapters, {{"format", "pt"}}));
    ENGINE_RETURN_IF_ERROR(
        WriteFileAtomically(temp / kAdapterConfigFile, contents.adapter_config_json));
  }
  if (!contents.config_json.empty()) {
    ENGINE_RETURN_IF_ERROR(WriteFileAtomically(temp / kConfigFile, contents.config_json));
  }
  for (const auto& [name, bytes] : contents.extra_files) {
    ENGINE_RETURN_IF_ERROR(WriteFileAtomically(temp / name, bytes));
  }
  ENGINE_RETURN_IF_ERROR(RecordFileDigests(temp, contents.staged_files, &manifest));
  std::string text;
  google::protobuf::TextFormat::PrintToString(manifest, &text);
  ENGINE_RETURN_IF_ERROR(WriteFileAtomically(temp / kManifestFile, text));
  return WriteFileAtomically(temp / kManifestHashFile, ContentHash(text) + "\n");
}

// The manifest's `text` against its recorded hash, when it has one.
Status CheckManifestHash(const std::filesystem::path& dir, const std::string& text) {
  const std::filesystem::path recorded_file = dir / kManifestHashFile;
  std::error_code ec;
  if (!std::filesystem::exists(recorded_file, ec)) return Status::Ok();
  // 16 hex digits and a newline; anything much longer is not a hash file.
  if (std::filesystem::file_size(recorded_file, ec) > 64 || ec) {
    return DataLossError("'" + recorded_file.string() + "' is not a manifest hash");
  }
  ENGINE_ASSIGN_OR_RETURN(std::string recorded, ReadFile(recorded_file));
  while (!recorded.empty() && std::isspace(static_cast<unsigned char>(recorded.back()))) {
    recorded.pop_back();
  }
  const std::string actual = ContentHash(text);
  if (recorded == actual) return Status::Ok();
  return DataLossError("checkpoint manifest '" + (dir / kManifestFile).string() +
                       "' changed after it was written: its content hash is " + actual + ", " +
                       kManifestHashFile + " records " + recorded +
                       "; the checkpoint cannot be trusted");
}

}  // namespace

Status PublishDirectory(const std::filesystem::path& dir,
                        const std::function<Status(const std::filesystem::path&)>& fill) {
  const std::filesystem::path parent = dir.parent_path();
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) return IoError("cannot create '" + parent.string() + "': " + ec.message());
  const std::filesystem::path temp = parent / HiddenTemporaryName(dir);
  std::filesystem::create_directory(temp, ec);
  if (ec) return IoError("cannot create '" + temp.string() + "': " + ec.message());
  ScopedRemoveTree cleanup(temp);
  ENGINE_RETURN_IF_ERROR(fill(temp));
  ENGINE_RETURN_IF_ERROR(SyncDirectory(temp));
  bool swapped = false;
  ENGINE_RETURN_IF_ERROR(Publish(temp, dir, &swapped));
  // After a swap `temp` holds what was at `dir` before, which the cleanup removes; after a plain
  // rename it no longer exists.
  if (!swapped) cleanup.Release();
  return SyncDirectory(parent);
}

Status WriteCheckpoint(const std::filesystem::path& dir, CheckpointContents contents) {
  // The ranks' staged files are in the checkpoint now, or lost with a write that failed.
  const ScopedRemoveTree staged(contents.staged_dir);
  Status status = PublishDirectory(dir, [&](const std::filesystem::path& temp) {
    return WriteContents(temp, std::move(contents));
  });
  if (status.ok()) return status;
  // A full disk, a quota or a size limit lands here: say plainly that nothing was lost.
  return Status(status.code(),
                "checkpoint '" + dir.string() +
                    "' was not written (earlier checkpoints are intact): " + status.message());
}

StatusOr<proto::CheckpointManifest> ReadManifest(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / kManifestFile;
  ENGINE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  proto::CheckpointManifest manifest;
  if (!google::protobuf::TextFormat::ParseFromString(text, &manifest)) {
    return DataLossError("checkpoint manifest '" + path.string() + "' is corrupt");
  }
  ENGINE_RETURN_IF_ERROR(CheckManifestHash(dir, text));
  if (manifest.format_version() == 0 || manifest.format_version() > kCheckpointFormatVersion) {
    return FailedPreconditionError(
        "checkpoint manifest '" + path.string() + "' has format version " +
        std::to_string(manifest.format_version()) + "; this engine reads versions up to " +
        std::to_string(kCheckpointFormatVersion));
  }
  return manifest;
}

proto::TensorInfo DescribeTensor(const std::string& name, const at::Tensor& tensor) {
  return DescribeTensor(name, tensor.scalar_type(), tensor.sizes().vec(), tensor.requires_grad());
}

proto::TensorInfo DescribeTensor(const std::string& name, at::ScalarType dtype,
                                 const std::vector<int64_t>& shape, bool trainable) {
  proto::TensorInfo info;
  info.set_name(name);
  auto stored = SafetensorsDtypeName(dtype);
  info.set_dtype(stored ? std::string(*stored) : std::string(DtypeShortName(dtype)));
  for (int64_t d : shape) info.add_shape(d);
  info.set_trainable(trainable);
  return info;
}

StatusOr<proto::FileDigest> DigestFile(const std::filesystem::path& file, const std::string& name) {
  ENGINE_ASSIGN_OR_RETURN(std::string hash, FileContentHash(file));
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(file, ec);
  if (ec) return IoError("cannot read the size of '" + file.string() + "': " + ec.message());
  proto::FileDigest digest;
  digest.set_name(name);
  digest.set_size(size);
  digest.set_xxh3(hash);
  return digest;
}

Status VerifyFileDigests(const std::filesystem::path& dir,
                         const google::protobuf::RepeatedPtrField<proto::FileDigest>& files) {
  for (const proto::FileDigest& digest : files) {
    const std::filesystem::path file = dir / digest.name();
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(file, ec);
    if (ec) return DataLossError(file.string() + " is missing (" + ec.message() + ")");
    if (size != digest.size()) {
      return DataLossError(file.string() + " is " + std::to_string(size) +
                           " bytes; when written it was " + std::to_string(digest.size()));
    }
    ENGINE_ASSIGN_OR_RETURN(std::string hash, FileContentHash(file));
    if (hash != digest.xxh3()) {
      return DataLossError(file.string() + " changed since it was written (content hash " + hash +
                           ", its manifest records " + digest.xxh3() + ")");
    }
  }
  return Status::Ok();
}

std::string RankFileName(RankFile kind, int rank, int world_size) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s%05d-of-%05d.safetensors", RankFilePrefix(kind), rank,
                world_size);
  return name;
}

StatusOr<std::vector<std::string>> RankFiles(const proto::CheckpointManifest& manifest,
                                             RankFile kind) {
  std::set<std::string> listed;
  int world_size = 0;
  const std::string pattern = std::string(RankFilePrefix(kind)) + "%d-of-%d";
  for (const proto::FileDigest& file : manifest.file()) {
    int rank = 0;
    int world = 0;
    if (std::sscanf(file.name().c_str(), pattern.c_str(), &rank, &world) != 2 ||
        file.name() != RankFileName(kind, rank, world)) {
      continue;
    }
    if (world_size != 0 && world != world_size) {
      return DataLossError("the checkpoint lists files of " + std::to_string(world_size) +
                           " and of " + std::to_string(world) + " ranks");
    }
    world_size = world;
    listed.insert(file.name());
  }
  std::vector<std::string> files;
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string name = RankFileName(kind, rank, world_size);
    if (listed.count(name) == 0) {
      return DataLossError("the checkpoint lacks rank " + std::to_string(rank) + "'s " +
                           (kind == RankFile::kWeights ? "weights" : "optimizer state") + ", " +
                           name);
    }
    files.push_back(name);
  }
  return files;
}

std::filesystem::path RankFilesStagingDir(const std::filesystem::path& dir) {
  return dir.parent_path() / ("." + dir.filename().string() + ".tmp-ranks");
}

void RemoveStaleTemporaries(const std::filesystem::path& parent,
                            const std::filesystem::path& keep) {
  std::error_code ec;
  if (!std::filesystem::is_directory(parent, ec)) return;
  std::vector<std::filesystem::path> stale;
  for (const auto& item : std::filesystem::directory_iterator(parent, ec)) {
    const std::string name = item.path().filename().string();
    if (item.path() == keep) continue;
    if (name.size() > 1 && name[0] == '.' && name.find(".tmp-") != std::string::npos) {
      stale.push_back(item.path());
    }
  }
  for (const auto& path : stale) RemoveTree(path, ec);
}

std::filesystem::path FinalCheckpointDir(const std::filesystem::path& stage_dir) {
  return stage_dir / "final";
}

std::filesystem::path PeriodicCheckpointDir(const std::filesystem::path& stage_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "%s%08lld", kPeriodicPrefix, static_cast<long long>(step));
  return stage_dir / kPeriodicDir / name;
}

std::vector<std::filesystem::path> PeriodicCheckpointDirs(const std::filesystem::path& stage_dir) {
  std::error_code ec;
  std::vector<std::filesystem::path> dirs;
  for (const auto& item : std::filesystem::directory_iterator(stage_dir / kPeriodicDir, ec)) {
    if (item.path().filename().string().rfind(kPeriodicPrefix, 0) == 0) dirs.push_back(item.path());
  }
  // step-NNNNNNNN sorts by step.
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::vector<std::filesystem::path> PeriodicCheckpointsOfRun(const std::filesystem::path& stage_dir,
                                                            const std::string& run_id,
                                                            int64_t max_step) {
  std::vector<std::pair<uint64_t, std::filesystem::path>> own;
  for (const auto& dir : PeriodicCheckpointDirs(stage_dir)) {
    auto manifest = ReadManifest(dir);
    if (manifest.ok() && manifest->run_id() == run_id &&
        manifest->step() <= static_cast<uint64_t>(max_step)) {
      own.emplace_back(manifest->step(), dir);
    }
  }
  std::sort(own.begin(), own.end());
  std::vector<std::filesystem::path> paths;
  for (auto& [step, path] : own) paths.push_back(path);
  return paths;
}

void RemoveOtherRunsCheckpoints(const std::filesystem::path& stage_dir, const std::string& run_id,
                                const std::string& context) {
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (const auto& dir : PeriodicCheckpointDirs(stage_dir)) {
    auto manifest = ReadManifest(dir);
    if (!manifest.ok() || manifest->run_id() != run_id) stale.push_back(dir);
  }
  for (const auto& path : stale) {
    LOG(INFO) << context << ": removing " << path.string() << " (from an earlier training)";
    RemoveTree(path, ec);
  }
}

}  // namespace engine
