// How a sharded stage (`parallel { strategy: SHARDED }`) splits its trainable parameters among the
// ranks of a group: one layout that the sharded optimizer updates by, the reduce-scatter of level
// 2 delivers gradients by and the all-gather of the updated parameters follows, so all three agree
// on which rank owns which element.
//
// The parameters, in order, are laid end to end and cut into buckets of at most `bucket_bytes` (a
// new bucket where the dtype changes; a parameter may span buckets, so every transient buffer is
// at most a bucket), each padded with zeros to a multiple of the world size; rank r owns the r-th
// equal slice ("shard") of every bucket. A bucket is full at a multiple of the world size, so only
// the last bucket of a run (before another dtype or block, or the end) has padding. Where a slice
// meets a parameter, this rank owns a part of it: a run of its elements, and `view`, a flat view of
// them that shares the parameter's memory (detached: it records no autograd history, and may carry
// a .grad of its own).
//
// Plain data, built once per stage; read-only afterwards (any thread).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace engine {

struct ShardLayout {
  // `length` elements of parameter `parameter` from its element `from`, at element `at` of a
  // bucket.
  struct Piece {
    size_t parameter = 0;
    int64_t from = 0;
    int64_t at = 0;
    int64_t length = 0;
  };
  // `elements` consecutive elements of the parameters, of one dtype; each rank's slice is `shard`
  // of them (the last one padded).
  struct Bucket {
    std::vector<Piece> pieces;
    int64_t elements = 0;
    int64_t shard = 0;
    at::ScalarType dtype = at::kFloat;
    std::vector<size_t> parts;  // this rank's, in slice order
    // The block (shard_level 3: one of Model::blocks()) whose parameters this bucket holds; -1
    // for parameters kept whole on every rank.
    int block = -1;
  };
  // This rank's share of a piece: `length` elements of parameter `parameter` from its element
  // `from`, at element `to` of this rank's slice of bucket `bucket`.
  struct Part {
    size_t bucket = 0;
    size_t parameter = 0;
    int64_t from = 0;
    int64_t to = 0;
    int64_t length = 0;
    at::Tensor view;
  };

  int world_size = 1;
  int rank = 0;
  // Per parameter, its whole shape (at shard_level 3 a block's parameters are empty between uses).
  std::vector<std::vector<int64_t>> shapes;
  std::vector<Bucket> buckets;
  std::vector<Part> parts;

  // The largest bucket's shard, in elements (what per-bucket buffers are sized by).
  int64_t LargestShard() const;
};

// The layout of `parameters` (contiguous tensors, each viewable as one dimension) for `rank` of
// `world_size`, in buckets of at most `bucket_bytes` (and at least one element per rank).
// `block_of`: empty, or per parameter its block (-1: none); a bucket holds one block's parameters
// only, so that a block is gathered by its own buckets.
ShardLayout MakeShardLayout(const std::vector<at::Tensor>& parameters, int world_size, int rank,
                            int64_t bucket_bytes, const std::vector<int>& block_of = {});

}  // namespace engine
