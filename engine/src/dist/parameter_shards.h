// The parameters of a stage at shard_level 3 (`parallel { strategy: SHARDED shard_level: 3 }`,
// ZeRO stage 3): each rank keeps only its slices of the trainable parameters of the model's blocks
// (Model::blocks()), and a block's parameters are whole only while it runs.
//
// The layout (dist/shard_layout.h) puts each block's trainable parameters in buckets of their own.
// This rank's slice of such a bucket lives in a tensor kept here, and the layout's parts view it
// instead of the parameter, so the sharded optimizer updates the slices and the reduce-scatter
// leaves the parts' gradients there, as at level 2. The parameters themselves hold no elements
// (empty tensors) until their block runs: RunBlock (engine/model_block.h) reaches Run(), which
// all-gathers the block's buckets, makes its parameters views of what was gathered (a block's
// buckets of one dtype are gathered into one buffer, where its parameters lie end to end: see
// dist/shard_layout.h), runs the block without keeping its activations, and empties them again; the
// backward gathers them once more, recomputes the block and runs its backward (the gradients go to
// the reduce-scatter's hooks) before emptying them. While a block runs, the gather of the next one
// is on the wire already: block b + 1 in the forward, b - 1 in the backward (Model::blocks() lists
// them in the order Forward runs them; a prefetch of a block that does not come next is waited for
// and dropped). So at most two blocks' weights are whole, each in its gather buffer. A buffer goes
// back to a pool for the next gather once nothing views it any more. Trainable parameters outside
// every block, and frozen ones (a LoRA or 4-bit base), stay whole on every rank: the former are
// gathered after each update as at level 2, the latter never move.
//
// WithWholeParameters() makes every block's parameters whole on every rank for a while (a
// restore, an evaluation that cannot run a block at a time, a LoRA stage's final checkpoint), then
// copies this rank's parts of them back into its slices (so what a restore loaded into them is
// kept) and empties them.
//
// Every Run() and WithWholeParameters() is a collective: all ranks make the same calls in the same
// order. A failed collective in Run() throws std::runtime_error (it runs inside the forward and the
// backward), elsewhere it is returned.
//
// Ownership: borrows `group`, the parameters' tensors and the block modules, which must outlive
// it. Thread safety: the training thread, and LibTorch's backward thread while it runs the
// training thread's backward.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/block_runner.h"
#include "core/named_parameter.h"
#include "dist/data_parallel.h"
#include "dist/shard_layout.h"
#include "engine/status.h"

namespace engine {

// A block of the model: its full name and its module.
struct NamedBlock {
  std::string name;
  const torch::nn::Module* module = nullptr;
};

class ParameterShards : public BlockRunner {
 public:
  // The gather buffers kept for later gathers: enough for the runs of the two blocks whole at a
  // time, not one per block size (the first by dtype and size go first).
  static constexpr size_t kPooledBuffers = 4;

  // Lays `parameters` (the stage's trainable ones, in the optimizer's order) out over `group` in
  // buckets of `bucket_bytes`, keeps this rank's slices of the blocks' ones and empties those
  // parameters. Refuses, by name, a parameter that is not contiguous or that two blocks hold.
  static StatusOr<std::unique_ptr<ParameterShards>> Make(DataParallel* group,
                                                         std::vector<NamedParameter> parameters,
                                                         const std::vector<NamedBlock>& blocks,
                                                         int64_t bucket_bytes);
  ~ParameterShards() override;
  ParameterShards(const ParameterShards&) = delete;
  ParameterShards& operator=(const ParameterShards&) = delete;

  // The layout, whose parts of block parameters view this rank's slices.
  std::shared_ptr<const ShardLayout> layout() const { return layout_; }

  at::Tensor Run(const torch::nn::Module& block,
                 const std::function<at::Tensor(const at::Tensor&)>& forward,
                 const at::Tensor& input, bool checkpointing) override;

  // Runs `use` with every parameter whole (calls nest; only the outermost gathers and lets go).
  Status WithWholeParameters(const std::function<Status()>& use);
  // Whether a WithWholeParameters() call is running.
  bool whole() const { return whole_depth_ > 0; }
  // Waits for a prefetch still on the wire (a collective every rank makes at the same point): the
  // trainer calls it after the backward, before the optimizer writes the slices a gather reads.
  Status Settle();

  // Gather buffers kept for the next gathers (at most kPooledBuffers).
  size_t pooled_buffers() const { return free_buffers_.size(); }

  // Gathers made, and how many of them a prefetch had started.
  int64_t gathers() const { return gathers_; }
  int64_t prefetched_gathers() const { return prefetched_; }

  // Elements of block parameters this rank keeps, and of all block parameters.
  int64_t kept_elements() const;
  int64_t block_elements() const;

 private:
  ParameterShards(DataParallel* group, std::vector<NamedParameter> parameters);

  // Consecutive buckets of a block of one dtype, gathered into one buffer: each bucket's gather
  // lands at its offset, and the block's parameters in it lie end to end.
  struct GatherRun {
    at::ScalarType dtype = at::kFloat;
    int64_t elements = 0;
    std::vector<std::pair<size_t, int64_t>> buckets;  // the bucket, its offset in the buffer
  };
  // Where a block parameter's elements lie once gathered: in which of its block's runs, from where.
  struct GatheredAt {
    size_t run = 0;
    int64_t offset = 0;
  };
  // A block's all-gather on the wire: a buffer per run of the block, a collective per bucket.
  struct InFlight {
    int block = -1;
    std::vector<at::Tensor> gathered;  // per run, in runs_of_block_ order
    std::vector<std::unique_ptr<DataParallel::PendingSum>> pending;
  };

  // Lays out each block's runs and each of its parameters' place in them. Fails only on a layout
  // that breaks dist/shard_layout.h's promise (a parameter not end to end in its run).
  Status PlanGatherRuns();

  // Block b's parameters whole (a collective; from the prefetch when it is b's), then `next`'s
  // gather started (-1: none).
  Status Gather(int b, int next);
  InFlight StartGather(int b);
  // Waits for `flight` and makes its block's parameters views of its buffers, which the block keeps
  // until Release().
  Status FinishGather(InFlight& flight);
  // Waits for every collective of `flight` (the first error, if any); then Done() returns its
  // buffers and clears it.
  Status WaitFor(InFlight& flight);
  void Done(InFlight& flight);
  // Block b's parameters emptied, writing this rank's parts of them back into its slices first
  // where `write_back`; its gather buffers pooled where nothing else views them (an autograd graph
  // still alive frees its own when it dies).
  void Release(int b, bool write_back);
  // A buffer of `elements` of `dtype` on the group's device: one an earlier gather gave back where
  // the pool has one of that size.
  at::Tensor TakeBuffer(at::ScalarType dtype, int64_t elements);
  void ReturnBuffer(at::Tensor buffer);

  DataParallel* group_;
  std::vector<NamedParameter> parameters_;
  std::vector<std::vector<int64_t>> shapes_;  // per parameter, its whole shape
  std::shared_ptr<ShardLayout> layout_;
  std::map<const torch::nn::Module*, int> block_of_module_;
  std::vector<std::string> block_names_;
  std::vector<std::vector<size_t>> buckets_of_block_;
  std::vector<std::vector<size_t>> parameters_of_block_;
  std::vector<std::vector<GatherRun>> runs_of_block_;
  std::vector<GatheredAt> gathered_at_;                  // per parameter (block parameters only)
  std::vector<std::vector<at::Tensor>> whole_of_block_;  // per block: its buffers while whole
  std::vector<at::Tensor> slices_;  // per bucket: this rank's slice (undefined outside blocks)
  std::multimap<std::pair<at::ScalarType, int64_t>, at::Tensor> free_buffers_;
  InFlight prefetch_;
  int whole_depth_ = 0;
  int64_t gathers_ = 0;
  int64_t prefetched_ = 0;
};

}  // namespace engine
