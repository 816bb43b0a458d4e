// How the ranks of a sharded stage put their parts of the optimizer state into a checkpoint
// without gathering them on one rank: each rank writes its own file (RankStateFileName) into a
// staging directory beside the checkpoint and hashes it; the ranks exchange the outcomes, sizes
// and hashes; then rank 0 publishes the checkpoint with the files moved in (WriteCheckpoint's
// `staged_files`), so the checkpoint still appears whole or not at all.
//
// The ranks share the checkpoint's file system (the launcher starts them on one machine). A
// collective: every rank calls it at the same point. Thread safety: the training thread.
#pragma once

#include <filesystem>
#include <vector>

#include "dist/data_parallel.h"
#include "engine/checkpoint.pb.h"
#include "engine/status.h"
#include "train/optimizer.h"

namespace engine {

// What rank 0 publishes with the checkpoint (the other ranks get an empty one).
struct StagedRankFiles {
  std::filesystem::path dir;
  std::vector<proto::FileDigest> files;
};

// Writes this rank's StateParts() for checkpoint `checkpoint_dir`. A rank that cannot write fails
// every rank, naming it and its file, and the staging directory is removed.
StatusOr<StagedRankFiles> WriteRankStateFiles(DataParallel& group, const Optimizer& optimizer,
                                              const std::filesystem::path& checkpoint_dir);

}  // namespace engine
