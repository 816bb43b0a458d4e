// An optimizer whose state is split across the ranks of a data-parallel group (ZeRO stages 1 and
// 2, `parallel { strategy: SHARDED shard_level: 1|2 }`): each rank keeps the slots (AdamW's
// moments, SGD's momentum) of 1/world_size of the trainable elements, updates that part from the
// averaged gradients (at level 1 every rank holds them whole; at level 2 only its parts, which the
// reduce-scatter of dist/gradient_reduce_scatter.h left there), and the updated parts are
// all-gathered into every rank's weights.
//
// Which rank owns which elements is a ShardLayout (dist/shard_layout.h). The plain optimizer runs
// on views of this rank's parts of the parameters, with the gradients, factors and low-precision
// write-backs the whole parameters would get, so it computes what the plain optimizer computes on
// every rank (AdamW's fused pass bit for bit; LibTorch's vectorized kernels, which SGD runs, may
// round the last bit of an element differently where a part starts mid-vector), and holds slots for
// those parts only. After the update, each bucket is all-gathered through two buffers kept for the
// optimizer's life: a slice and a bucket of the largest bucket's size (per dtype).
//
// Masters: where the parameters are stored in low precision and the optimizer is to keep their f32
// masters, each rank keeps masters for its parts only, updates them with the low-precision
// gradients (as the plain optimizer updates the precision runtime's masters) and writes the
// rounded result into its part of the parameter; the parameters are then gathered in their own
// dtype.
//
// State() is empty. Each rank's StateParts() are its parts of the slots and masters, as pieces
// (checkpoint/tensor_pieces.h) of the plain optimizer's names and the parameters' shapes
// ("<parameter>.<slot>", and "<parameter>.master" for the masters it keeps, as the precision
// runtime names them): a checkpoint holds every rank's file, and nothing is gathered on one rank.
// LoadStatePieces() reads this rank's parts from them, whatever world size wrote them, or from the
// whole state a plain or DDP stage wrote.
//
// Ownership: borrows `group` and the parameters' tensors. Thread safety: the training thread only.
// A failed collective (a rank died) during a step throws, for the trainer's GuardedCall to report.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/data_parallel.h"
#include "dist/shard_layout.h"
#include "engine/pipeline.pb.h"
#include "train/optimizer.h"

namespace engine {

// Where a step's gradients reach a sharded optimizer.
enum class ShardedGradients {
  // Level 1: whole, on every rank; Step's feeds are empty or one per parameter.
  kWhole,
  // Level 2: this rank's parts only, each the .grad() of its part's view (ShardLayout::Part::view);
  // Step's feeds are empty or one per part, in the layout's order.
  kInParts,
};

// The layout of `parameters` over `group` in buckets of `bucket_bytes`; refuses, by name, a
// parameter that is not contiguous (its parts are updated in place through views).
StatusOr<std::shared_ptr<const ShardLayout>> LayOutShards(
    const std::vector<NamedParameter>& parameters, const DataParallel& group, int64_t bucket_bytes);

// `master_dtypes`: empty, or per parameter the dtype of the master to keep for this rank's part of
// it (Undefined: none), for parameters stored in low precision whose precision runtime leaves the
// masters to the optimizer (MasterHolder::kOptimizer). `layout` is LayOutShards' for the same
// parameters and group.
StatusOr<std::unique_ptr<Optimizer>> MakeShardedOptimizer(const proto::Optimizer& config,
                                                          std::vector<NamedParameter> parameters,
                                                          std::vector<at::ScalarType> master_dtypes,
                                                          DataParallel* group,
                                                          std::shared_ptr<const ShardLayout> layout,
                                                          ShardedGradients gradients);
// Level 1, with the layout made here.
StatusOr<std::unique_ptr<Optimizer>> MakeShardedOptimizer(const proto::Optimizer& config,
                                                          std::vector<NamedParameter> parameters,
                                                          std::vector<at::ScalarType> master_dtypes,
                                                          DataParallel* group,
                                                          int64_t bucket_bytes);

}  // namespace engine
