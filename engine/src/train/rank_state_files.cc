#include "train/rank_state_files.h"

#include <cinttypes>
#include <cstdio>
#include <string>
#include <system_error>

#include "checkpoint/checkpoint.h"
#include "checkpoint/tensor_pieces.h"
#include "core/remove_tree.h"

namespace engine {
namespace {

// What each rank tells the others about its file: whether it failed, its size and its XXH3-64 in
// two halves (f64 carries 32-bit integers exactly).
constexpr size_t kFields = 4;

std::vector<double> Report(const StatusOr<proto::FileDigest>& digest, int rank, int world_size) {
  std::vector<double> values(kFields * static_cast<size_t>(world_size), 0.0);
  double* mine = values.data() + kFields * static_cast<size_t>(rank);
  if (!digest.ok()) {
    mine[0] = 1;
    return values;
  }
  const uint64_t hash = std::stoull(digest->xxh3(), nullptr, 16);
  mine[1] = static_cast<double>(digest->size());
  mine[2] = static_cast<double>(hash >> 32);
  mine[3] = static_cast<double>(hash & 0xffffffffu);
  return values;
}

proto::FileDigest DigestOf(const std::vector<double>& reports, int rank, int world_size) {
  const double* report = reports.data() + kFields * static_cast<size_t>(rank);
  const uint64_t hash = (static_cast<uint64_t>(report[2]) << 32) | static_cast<uint64_t>(report[3]);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64, hash);
  proto::FileDigest digest;
  digest.set_name(RankStateFileName(rank, world_size));
  digest.set_size(static_cast<uint64_t>(report[1]));
  digest.set_xxh3(hex);
  return digest;
}

}  // namespace

StatusOr<StagedRankFiles> WriteRankStateFiles(DataParallel& group, const Optimizer& optimizer,
                                              const std::filesystem::path& checkpoint_dir) {
  const int rank = group.rank();
  const int world_size = group.world_size();
  StagedRankFiles staged;
  staged.dir = RankFilesStagingDir(checkpoint_dir);
  std::error_code ec;
  if (rank == 0) {
    RemoveTree(staged.dir, ec);
    ec.clear();
    std::filesystem::create_directories(staged.dir, ec);
  }
  ENGINE_ASSIGN_OR_RETURN(std::vector<double> made, group.Max({ec ? 1.0 : 0.0}));
  if (made[0] > 0) {
    return IoError("cannot create '" + staged.dir.string() + "' for the ranks' optimizer state" +
                   (ec ? ": " + ec.message() : std::string(" (rank 0 could not)")));
  }

  const std::string name = RankStateFileName(rank, world_size);
  const std::filesystem::path file = staged.dir / name;
  const Status written = WritePieces(file, optimizer.StateParts(),
                                     {{"format", "pt"},
                                      {"rank", std::to_string(rank)},
                                      {"world_size", std::to_string(world_size)}});
  const StatusOr<proto::FileDigest> digest =
      written.ok() ? DigestFile(file, name) : StatusOr<proto::FileDigest>(written);

  ENGINE_ASSIGN_OR_RETURN(std::vector<double> reports, group.Sum(Report(digest, rank, world_size)));
  for (int r = 0; r < world_size; ++r) {
    if (reports[kFields * static_cast<size_t>(r)] == 0) continue;
    if (rank == 0) RemoveTree(staged.dir, ec);
    if (r == rank) return digest.status();
    return IoError("rank " + std::to_string(r) + " could not write its optimizer state into '" +
                   (staged.dir / RankStateFileName(r, world_size)).string() + "'");
  }
  if (rank != 0) return StagedRankFiles();
  for (int r = 0; r < world_size; ++r) staged.files.push_back(DigestOf(reports, r, world_size));
  return staged;
}

}  // namespace engine
