#include "dist/shard_layout.h"

#include <algorithm>

namespace engine {

int64_t ShardLayout::LargestShard() const {
  int64_t shard = 0;
  for (const Bucket& bucket : buckets) shard = std::max(shard, bucket.shard);
  return shard;
}

ShardLayout MakeShardLayout(const std::vector<at::Tensor>& parameters, int world_size, int rank,
                            int64_t bucket_bytes, const std::vector<int>& block_of) {
  ShardLayout layout;
  layout.world_size = world_size;
  layout.rank = rank;
  std::vector<ShardLayout::Bucket>& buckets = layout.buckets;
  for (const at::Tensor& p : parameters) layout.shapes.push_back(p.sizes().vec());
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& p = parameters[i];
    const int block = block_of.empty() ? -1 : block_of[i];
    // A multiple of the world size: a full bucket needs no padding, so the gathered buckets of a
    // run of one block and dtype are its parameters end to end (shard_level 3 views them there).
    const int64_t capacity =
        std::max<int64_t>(world_size, bucket_bytes / static_cast<int64_t>(p.element_size()) /
                                          world_size * world_size);
    for (int64_t from = 0; from < p.numel();) {
      if (buckets.empty() || buckets.back().dtype != p.scalar_type() ||
          buckets.back().block != block || buckets.back().elements == capacity) {
        buckets.emplace_back();
        buckets.back().dtype = p.scalar_type();
        buckets.back().block = block;
      }
      ShardLayout::Bucket& bucket = buckets.back();
      const int64_t length = std::min(p.numel() - from, capacity - bucket.elements);
      bucket.pieces.push_back({i, from, bucket.elements, length});
      bucket.elements += length;
      from += length;
    }
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    ShardLayout::Bucket& bucket = buckets[b];
    bucket.shard = (bucket.elements + world_size - 1) / world_size;
    const int64_t lo = rank * bucket.shard;
    const int64_t hi = lo + bucket.shard;
    for (const ShardLayout::Piece& piece : bucket.pieces) {
      const int64_t begin = std::max(lo, piece.at);
      const int64_t end = std::min(hi, piece.at + piece.length);
      if (begin >= end) continue;
      ShardLayout::Part part;
      part.bucket = b;
      part.parameter = piece.parameter;
      part.from = piece.from + begin - piece.at;
      part.to = begin - lo;
      part.length = end - begin;
      part.view = parameters[piece.parameter].detach().view({-1}).narrow(0, part.from, part.length);
      bucket.parts.push_back(layout.parts.size());
      layout.parts.push_back(std::move(part));
    }
  }
  return layout;
}

}  // namespace engine
