// How the ranks of a sharded stage put their own parts of the optimizer state (and, at
// shard_level 3, of the blocks' weights) into a checkpoint without gathering them on one rank:
// each rank writes its files (checkpoint/checkpoint.h's RankFileName) into a staging directory
// beside the checkpoint and hashes them; the ranks exchange the outcomes, sizes and hashes; then
// rank 0 publishes the checkpoint with the files moved in (WriteCheckpoint's `staged_files`), so
// the checkpoint still appears whole or not at all.
//
// The ranks share the checkpoint's file system (the launcher starts them on one machine). A
// collective: every rank calls it at the same point with the same kinds. Thread safety: the
// training thread.
#pragma once

#include <filesystem>
#include <functional>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/tensor_pieces.h"
#include "core/named_parameter.h"
#include "dist/data_parallel.h"
#include "dist/shard_layout.h"
#include "engine/checkpoint.pb.h"
#include "engine/status.h"

namespace engine {

// What rank 0 publishes with the checkpoint (the other ranks get an empty one).
struct StagedRankFiles {
  std::filesystem::path dir;
  std::vector<proto::FileDigest> files;
};

// Writes this rank's files (one per kind, what each function gives) for checkpoint
// `checkpoint_dir`. A rank that cannot make or write one (an error or an exception) fails every
// rank, naming it and its file, and the staging directory is removed.
using RankFileParts = std::pair<RankFile, std::function<PiecesToWrite()>>;
StatusOr<StagedRankFiles> WriteRankFiles(DataParallel& group,
                                         const std::vector<RankFileParts>& files,
                                         const std::filesystem::path& checkpoint_dir);

// This rank's parts of the blocks' parameters at shard_level 3 (`layout`'s parts of buckets that
// belong to a block; `parameters` in the layout's order), as pieces of their names.
PiecesToWrite BlockWeightParts(const ShardLayout& layout,
                               const std::vector<NamedParameter>& parameters);
// The same parameters whole, as a manifest lists them (the same on every rank).
std::vector<proto::TensorInfo> BlockWeightTensors(const ShardLayout& layout,
                                                  const std::vector<NamedParameter>& parameters);

}  // namespace engine
