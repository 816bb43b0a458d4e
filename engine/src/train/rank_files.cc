#include "train/rank_files.h"

#include <cinttypes>
#include <cstdio>
#include <set>
#include <string>
#include <system_error>

#include "core/guarded_call.h"
#include "core/remove_tree.h"

namespace engine {
namespace {

// What each rank tells the others about each of its files: whether it failed, its size and its
// XXH3-64 in two halves (f64 carries 32-bit integers exactly).
constexpr size_t kFields = 4;

void Report(const StatusOr<proto::FileDigest>& digest, double* fields) {
  if (!digest.ok()) {
    fields[0] = 1;
    return;
  }
  const uint64_t hash = std::stoull(digest->xxh3(), nullptr, 16);
  fields[1] = static_cast<double>(digest->size());
  fields[2] = static_cast<double>(hash >> 32);
  fields[3] = static_cast<double>(hash & 0xffffffffu);
}

proto::FileDigest DigestOf(const double* fields, const std::string& name) {
  const uint64_t hash = (static_cast<uint64_t>(fields[2]) << 32) | static_cast<uint64_t>(fields[3]);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64, hash);
  proto::FileDigest digest;
  digest.set_name(name);
  digest.set_size(static_cast<uint64_t>(fields[1]));
  digest.set_xxh3(hex);
  return digest;
}

}  // namespace

StatusOr<StagedRankFiles> WriteRankFiles(DataParallel& group,
                                         const std::vector<RankFileParts>& files,
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
    return IoError("cannot create '" + staged.dir.string() + "' for the ranks' files" +
                   (ec ? ": " + ec.message() : std::string(" (rank 0 could not)")));
  }

  // reports[(r * files + f) * kFields ...]: rank r's file f.
  const size_t count = files.size();
  std::vector<double> reports(kFields * count * static_cast<size_t>(world_size), 0.0);
  std::vector<Status> outcomes;
  for (size_t f = 0; f < count; ++f) {
    const std::string name = RankFileName(files[f].first, rank, world_size);
    const std::filesystem::path file = staged.dir / name;
    // Every rank reaches the exchange below, whatever happens here.
    const Status written = GuardedCall("rank " + std::to_string(rank), [&] {
      return WritePieces(file, files[f].second(),
                         {{"format", "pt"},
                          {"rank", std::to_string(rank)},
                          {"world_size", std::to_string(world_size)}});
    });
    const StatusOr<proto::FileDigest> digest =
        written.ok() ? DigestFile(file, name) : StatusOr<proto::FileDigest>(written);
    outcomes.push_back(digest.status());
    Report(digest, &reports[(static_cast<size_t>(rank) * count + f) * kFields]);
  }
  ENGINE_ASSIGN_OR_RETURN(reports, group.Sum(reports));
  for (int r = 0; r < world_size; ++r) {
    for (size_t f = 0; f < count; ++f) {
      if (reports[(static_cast<size_t>(r) * count + f) * kFields] == 0) continue;
      if (rank == 0) RemoveTree(staged.dir, ec);
      if (r == rank) return outcomes[f];
      return IoError("rank " + std::to_string(r) + " could not write '" +
                     (staged.dir / RankFileName(files[f].first, r, world_size)).string() + "'");
    }
  }
  if (rank != 0) return StagedRankFiles();
  for (int r = 0; r < world_size; ++r) {
    for (size_t f = 0; f < count; ++f) {
      staged.files.push_back(DigestOf(&reports[(static_cast<size_t>(r) * count + f) * kFields],
                                      RankFileName(files[f].first, r, world_size)));
    }
  }
  return staged;
}

PiecesToWrite BlockWeightParts(const ShardLayout& layout,
                               const std::vector<NamedParameter>& parameters) {
  PiecesToWrite out;
  for (const ShardLayout::Part& part : layout.parts) {
    if (layout.buckets[part.bucket].block < 0) continue;
    const std::string& name = parameters[part.parameter].name;
    out.pieces.emplace_back(PieceName(name, part.from), part.view);
    out.shapes[name] = layout.shapes[part.parameter];
  }
  return out;
}

std::vector<proto::TensorInfo> BlockWeightTensors(const ShardLayout& layout,
                                                  const std::vector<NamedParameter>& parameters) {
  std::vector<proto::TensorInfo> out;
  std::set<size_t> listed;
  for (const ShardLayout::Bucket& bucket : layout.buckets) {
    if (bucket.block < 0) continue;
    for (const ShardLayout::Piece& piece : bucket.pieces) {
      if (!listed.insert(piece.parameter).second) continue;
      out.push_back(DescribeTensor(parameters[piece.parameter].name, bucket.dtype,
                                   layout.shapes[piece.parameter], /*trainable=*/true));
    }
  }
  return out;
}

}  // namespace engine
