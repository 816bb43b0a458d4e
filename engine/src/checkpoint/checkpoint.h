// Checkpoint directories: weights, optimizer state and a manifest, published atomically.
//
//   <dir>/model.safetensors      every parameter and buffer, by name, in its stored dtype; a slim
//                                checkpoint's only those outside its frozen base and its adapter
//                                file (checkpoint/checkpoint_tensors.h reads them wherever they
//                                are)
//   <dir>/optimizer.safetensors  optimizer slots ("<param>.exp_avg"), when saved
//   <dir>/config.json            the model's configuration (Hugging Face's name for it), when given
//   <dir>/adapter_model.safetensors, adapter_config.json
//                                the adapter parameters alone, as PEFT names and describes them
//   <dir>/manifest.pbtxt         engine.proto.CheckpointManifest, protobuf text, with the size and
//                                content hash of every other file
//   <dir>/manifest.xxh3          the manifest's own content hash, written last, so that an edited
//                                manifest is found as an edited tensor file is (a checkpoint of an
//                                older engine has none, and its manifest is taken as it is)
//
// WriteCheckpoint builds the directory under a hidden temporary name beside `dir`, syncs every
// file, then swaps it into place in one rename (replacing an older checkpoint of the same name,
// atomically). A crash at any moment leaves either the old checkpoint or the new one, plus perhaps
// a hidden
// ".<name>.tmp-*" directory that RemoveStaleTemporaries clears; ReadManifest never accepts one.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/checkpoint.pb.h"
#include "engine/safetensors.h"
#include "engine/status.h"

namespace engine {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kManifestFile = "manifest.pbtxt";
inline constexpr const char* kManifestHashFile = "manifest.xxh3";
inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kAdapterFile = "adapter_model.safetensors";
inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
// PEFT's names for adapter tensors: "base_model.model." + the parameter's name in the model.
inline constexpr const char* kPeftPrefix = "base_model.model.";
// The newest layout this engine writes and reads. Version 2: a slim checkpoint (frozen_base,
// adapter_file_tensor), which an engine that reads only version 1 would take for a broken one.
// Version 3: the optimizer state or weights in the ranks' files (RankFileName), which an engine
// that reads only optimizer.safetensors and model.safetensors would resume without. Other
// checkpoints are still written as the oldest version that describes them.
inline constexpr uint32_t kCheckpointFormatVersion = 3;
inline constexpr uint32_t kSlimFormatVersion = 2;
inline constexpr uint32_t kSelfContainedFormatVersion = 1;

struct CheckpointContents {
  proto::CheckpointManifest manifest;  // tensor list and format version are filled in by the writer
  safetensors::NamedTensors model;
  safetensors::NamedTensors optimizer;  // empty: no optimizer file
  safetensors::Metadata optimizer_metadata;
  std::string config_json;             // empty: no config.json
  safetensors::NamedTensors adapters;  // empty: no adapter files
  std::string adapter_config_json;
  // More files by name (the data's tokenizer.json and tokenizer_config.json).
  std::map<std::string, std::string> extra_files;
  // Files the ranks of a sharded stage wrote into `staged_dir` (RankFilesStagingDir), with their
  // sizes and hashes: moved into the checkpoint as they are; `staged_dir` is removed afterwards,
  // whether the checkpoint was written or not.
  std::filesystem::path staged_dir;
  std::vector<proto::FileDigest> staged_files;
  // The model tensors the ranks' weight files hold (RankFile::kWeights), listed in the manifest
  // after model.safetensors's.
  std::vector<proto::TensorInfo> rank_file_tensors;
};

Status WriteCheckpoint(const std::filesystem::path& dir, CheckpointContents contents);

// The same publication for any directory: `fill` writes the files into a hidden temporary
// directory beside `dir`, which is synced and then swapped into place (what was at `dir` is
// removed). On error nothing appears at `dir` and the temporary is removed.
Status PublishDirectory(const std::filesystem::path& dir,
                        const std::function<Status(const std::filesystem::path&)>& fill);

// In a sharded stage's checkpoint (`parallel { strategy: SHARDED }`), the files each rank writes
// its own parts into, as pieces (checkpoint/tensor_pieces.h), so that nothing is gathered on one
// rank: of the optimizer state and masters ("optimizer-rank-00001-of-00004.safetensors";
// optimizer.safetensors then holds the training state only), and at shard_level 3 of the blocks'
// weights ("model-rank-00001-of-00004.safetensors"; model.safetensors then holds the rest, and the
// manifest lists every tensor).
enum class RankFile { kOptimizerState, kWeights };
std::string RankFileName(RankFile kind, int rank, int world_size);
// The ranks' files of `kind` a manifest lists, in rank order; empty when it lists none. One rank's
// file missing from the list is a DATA_LOSS error naming it.
StatusOr<std::vector<std::string>> RankFiles(const proto::CheckpointManifest& manifest,
                                             RankFile kind);
// Where the ranks write their files before rank 0 publishes checkpoint `dir` with them: a hidden
// directory beside it, which RemoveStaleTemporaries clears after a crash.
std::filesystem::path RankFilesStagingDir(const std::filesystem::path& dir);

// A stage's directory (<output_dir>/<stage>) holds its final checkpoint and its periodic ones:
//   <stage_dir>/final/
//   <stage_dir>/checkpoints/step-00000042/
std::filesystem::path FinalCheckpointDir(const std::filesystem::path& stage_dir);
std::filesystem::path PeriodicCheckpointDir(const std::filesystem::path& stage_dir, int64_t step);
// The periodic checkpoint directories under `stage_dir`, oldest step first; never the hidden
// temporaries of writes that did not finish.
std::vector<std::filesystem::path> PeriodicCheckpointDirs(const std::filesystem::path& stage_dir);

// Reads and checks `<dir>/manifest.pbtxt`, against manifest.xxh3 when there is one (a DATA_LOSS
// error naming both when the manifest changed after it was written).
StatusOr<proto::CheckpointManifest> ReadManifest(const std::filesystem::path& dir);

// Checks the files of `dir` a manifest lists (a checkpoint's: all but the manifest; a frozen
// base's: its directory's) against the size and content hash recorded when it was written: a
// DATA_LOSS error naming the first file that is missing, of another size or changed in place. A
// manifest without digests (an older engine's) passes.
Status VerifyFileDigests(const std::filesystem::path& dir,
                         const google::protobuf::RepeatedPtrField<proto::FileDigest>& files);

// A manifest's record of one tensor: its name, safetensors dtype, shape and whether it trains.
proto::TensorInfo DescribeTensor(const std::string& name, const at::Tensor& tensor);
proto::TensorInfo DescribeTensor(const std::string& name, at::ScalarType dtype,
                                 const std::vector<int64_t>& shape, bool trainable);

// A manifest's record of `file` (size and content hash), under `name`.
StatusOr<proto::FileDigest> DigestFile(const std::filesystem::path& file, const std::string& name);

// Removes hidden temporary directories left in `parent` by interrupted writes, but `keep`.
void RemoveStaleTemporaries(const std::filesystem::path& parent,
                            const std::filesystem::path& keep = {});

// The periodic checkpoints (<stage_dir>/checkpoints/step-*) that training `run_id` wrote up to
// step `max_step`, oldest first.
std::vector<std::filesystem::path> PeriodicCheckpointsOfRun(const std::filesystem::path& stage_dir,
                                                            const std::string& run_id,
                                                            int64_t max_step);

// Once training `run_id` has finished, the periodic checkpoints of earlier trainings of the stage
// (of another configuration, or started over) can no longer be resumed from: removes them, saying
// so in the log after `context`.
void RemoveOtherRunsCheckpoints(const std::filesystem::path& stage_dir, const std::string& run_id,
                                const std::string& context);

}  // namespace engine
