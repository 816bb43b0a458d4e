#include "dist/parameter_shards.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/module.h>

#include <memory>
#include <stdexcept>
#include <utility>

#include "engine/activation_checkpoint.h"

namespace engine {
namespace {

at::Tensor Flat(const at::Tensor& t) { return t.view({-1}); }

}  // namespace

ParameterShards::ParameterShards(DataParallel* group, std::vector<NamedParameter> parameters)
    : group_(group), parameters_(std::move(parameters)) {}

ParameterShards::~ParameterShards() {
  // c10d may still write into the buffers of a prefetch an error left on the wire.
  Settle().IgnoreError();
}

StatusOr<std::unique_ptr<ParameterShards>> ParameterShards::Make(
    DataParallel* group, std::vector<NamedParameter> parameters,
    const std::vector<NamedBlock>& blocks, int64_t bucket_bytes) {
  std::unique_ptr<ParameterShards> shards(new ParameterShards(group, std::move(parameters)));
  std::vector<NamedParameter>& params = shards->parameters_;
  // Which block holds each parameter, by the identity of its tensor.
  std::map<const c10::TensorImpl*, size_t> index_of;
  for (size_t i = 0; i < params.size(); ++i) index_of[params[i].tensor.unsafeGetTensorImpl()] = i;
  std::vector<int> block_of(params.size(), -1);
  for (size_t b = 0; b < blocks.size(); ++b) {
    shards->block_of_module_[blocks[b].module] = static_cast<int>(b);
    shards->block_names_.push_back(blocks[b].name);
    for (const at::Tensor& p : blocks[b].module->parameters()) {
      auto it = index_of.find(p.unsafeGetTensorImpl());
      if (it == index_of.end()) continue;  // frozen: whole on every rank
      if (block_of[it->second] >= 0) {
        return FailedPreconditionError("the model's blocks '" + blocks[block_of[it->second]].name +
                                       "' and '" + blocks[b].name + "' both hold '" +
                                       params[it->second].name +
                                       "'; shard_level 3 gathers each parameter with one block");
      }
      block_of[it->second] = static_cast<int>(b);
    }
  }
  std::vector<at::Tensor> tensors;
  for (const NamedParameter& p : params) {
    if (!p.tensor.is_contiguous()) {
      return FailedPreconditionError("shard_level 3 keeps parts of '" + p.name +
                                     "' apart from it, and it is not contiguous in memory");
    }
    tensors.push_back(p.tensor);
    shards->shapes_.push_back(p.tensor.sizes().vec());
  }
  shards->layout_ = std::make_shared<ShardLayout>(
      MakeShardLayout(tensors, group->world_size(), group->rank(), bucket_bytes, block_of));
  ShardLayout& layout = *shards->layout_;

  // This rank's slices of the blocks' buckets, which the parts view from now on.
  at::NoGradGuard no_grad;
  shards->buckets_of_block_.resize(blocks.size());
  shards->parameters_of_block_.resize(blocks.size());
  shards->slices_.resize(layout.buckets.size());
  for (size_t k = 0; k < layout.buckets.size(); ++k) {
    const ShardLayout::Bucket& bucket = layout.buckets[k];
    if (bucket.block < 0) continue;
    shards->buckets_of_block_[bucket.block].push_back(k);
    const at::Tensor& first = params[bucket.pieces.front().parameter].tensor;
    at::Tensor slice = at::zeros({bucket.shard}, first.options().requires_grad(false));
    for (size_t part_index : bucket.parts) {
      ShardLayout::Part& part = layout.parts[part_index];
      at::Tensor kept = slice.narrow(0, part.to, part.length);
      kept.copy_(part.view);
      part.view = kept;
    }
    shards->slices_[k] = std::move(slice);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (block_of[i] >= 0) shards->parameters_of_block_[block_of[i]].push_back(i);
  }
  ENGINE_RETURN_IF_ERROR(shards->PlanGatherRuns());
  shards->whole_of_block_.resize(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) shards->Release(static_cast<int>(b), false);
  return shards;
}

Status ParameterShards::PlanGatherRuns() {
  const ShardLayout& layout = *layout_;
  runs_of_block_.resize(buckets_of_block_.size());
  gathered_at_.resize(parameters_.size());
  std::vector<bool> placed(parameters_.size(), false);
  for (size_t b = 0; b < buckets_of_block_.size(); ++b) {
    std::vector<GatherRun>& runs = runs_of_block_[b];
    for (size_t k : buckets_of_block_[b]) {
      const ShardLayout::Bucket& bucket = layout.buckets[k];
      if (runs.empty() || runs.back().dtype != bucket.dtype) {
        runs.emplace_back();
        runs.back().dtype = bucket.dtype;
      }
      GatherRun& run = runs.back();
      const int64_t offset = run.elements;
      run.buckets.emplace_back(k, offset);
      run.elements += bucket.shard * layout.world_size;
      for (const ShardLayout::Piece& piece : bucket.pieces) {
        const GatheredAt at{runs.size() - 1, offset + piece.at - piece.from};
        GatheredAt& first = gathered_at_[piece.parameter];
        if (!placed[piece.parameter]) {
          first = at;
          placed[piece.parameter] = true;
        } else if (first.run != at.run || first.offset != at.offset) {
          return InternalError("the buckets of block '" + block_names_[b] + "' do not hold '" +
                               parameters_[piece.parameter].name + "' end to end");
        }
      }
    }
  }
  return Status::Ok();
}

at::Tensor ParameterShards::TakeBuffer(at::ScalarType dtype, int64_t elements) {
  auto it = free_buffers_.find({dtype, elements});
  if (it != free_buffers_.end()) {
    at::Tensor buffer = std::move(it->second);
    free_buffers_.erase(it);
    return buffer;
  }
  return at::empty({elements}, at::TensorOptions().dtype(dtype).device(group_->device()));
}

void ParameterShards::ReturnBuffer(at::Tensor buffer) {
  // Blocks of many sizes (an MLP of several widths) would otherwise leave a buffer of each.
  if (free_buffers_.size() >= kPooledBuffers) free_buffers_.erase(free_buffers_.begin());
  const std::pair<at::ScalarType, int64_t> key{buffer.scalar_type(), buffer.numel()};
  free_buffers_.emplace(key, std::move(buffer));
}

ParameterShards::InFlight ParameterShards::StartGather(int b) {
  InFlight flight;
  flight.block = b;
  for (const GatherRun& run : runs_of_block_[b]) {
    at::Tensor gathered = TakeBuffer(run.dtype, run.elements);
    for (const auto& [k, offset] : run.buckets) {
      const int64_t elements = layout_->buckets[k].shard * group_->world_size();
      at::Tensor slice = slices_[k];
      if (slice.device() != group_->device()) slice = slice.to(group_->device());
      flight.pending.push_back(group_->StartAllGather(slice, gathered.narrow(0, offset, elements)));
    }
    flight.gathered.push_back(std::move(gathered));
  }
  return flight;
}

Status ParameterShards::WaitFor(InFlight& flight) {
  Status status;
  for (auto& pending : flight.pending) {
    Status waited = pending->Wait();
    if (status.ok() && !waited.ok()) status = std::move(waited);
  }
  flight.pending.clear();
  return status;
}

void ParameterShards::Done(InFlight& flight) {
  for (at::Tensor& buffer : flight.gathered) ReturnBuffer(std::move(buffer));
  flight = InFlight();
}

Status ParameterShards::FinishGather(InFlight& flight) {
  at::NoGradGuard no_grad;
  const int b = flight.block;
  const Status status = WaitFor(flight);
  if (!status.ok()) {
    Done(flight);
    return status.WithContext("gathering the parameters of block '" + block_names_[b] + "'");
  }
  std::vector<at::Tensor>& buffers = whole_of_block_[b];
  buffers = std::move(flight.gathered);
  flight = InFlight();
  for (size_t i : parameters_of_block_[b]) {
    at::Tensor& p = parameters_[i].tensor;
    const int64_t numel = c10::multiply_integers(shapes_[i]);
    if (numel == 0) {  // in no bucket
      p.set_data(at::empty(shapes_[i], p.options().requires_grad(false)));
      continue;
    }
    at::Tensor& buffer = buffers[gathered_at_[i].run];
    // Gloo on a GPU's parameters gathers on the host: the block gets a copy on its device.
    if (buffer.device() != p.device()) {
      at::Tensor on_device = buffer.to(p.device());
      ReturnBuffer(std::move(buffer));
      buffer = std::move(on_device);
    }
    p.set_data(buffer.narrow(0, gathered_at_[i].offset, numel).view(shapes_[i]));
  }
  return Status::Ok();
}

Status ParameterShards::Settle() {
  if (prefetch_.block < 0) return Status::Ok();
  const Status status = WaitFor(prefetch_);
  Done(prefetch_);
  return status;
}

Status ParameterShards::Gather(int b, int next) {
  InFlight flight;
  if (prefetch_.block == b) {
    flight = std::move(prefetch_);
    prefetch_ = InFlight();
    ++prefetched_;
  } else {
    ENGINE_RETURN_IF_ERROR(Settle());
    flight = StartGather(b);
  }
  ++gathers_;
  if (next >= 0) prefetch_ = StartGather(next);
  return FinishGather(flight);
}

void ParameterShards::Release(int b, bool write_back) {
  at::NoGradGuard no_grad;
  if (write_back) {
    for (size_t k : buckets_of_block_[b]) {
      for (size_t part_index : layout_->buckets[k].parts) {
        const ShardLayout::Part& part = layout_->parts[part_index];
        part.view.copy_(Flat(parameters_[part.parameter].tensor).narrow(0, part.from, part.length));
      }
    }
  }
  for (size_t i : parameters_of_block_[b]) {
    at::Tensor& p = parameters_[i].tensor;
    p.set_data(at::empty({0}, p.options().requires_grad(false)));
  }
  for (at::Tensor& buffer : whole_of_block_[b]) {
    if (buffer.device() == group_->device() && buffer.use_count() == 1 &&
        buffer.storage().use_count() == 1) {
      ReturnBuffer(std::move(buffer));
    }
  }
  whole_of_block_[b].clear();
}

at::Tensor ParameterShards::Run(const torch::nn::Module& block,
                                const std::function<at::Tensor(const at::Tensor&)>& forward,
                                const at::Tensor& input, bool checkpointing) {
  auto it = block_of_module_.find(&block);
  if (it == block_of_module_.end()) return at::Tensor();
  const int b = it->second;
  if (whole_depth_ > 0 || parameters_of_block_[b].empty()) {
    return checkpointing ? CheckpointedForward(forward, input) : forward(input);
  }
  // The first run is the forward's (prefetching the block after it), a second the backward's
  // recomputation (prefetching the block before it).
  auto runs = std::make_shared<int>(0);
  return CheckpointedForwardAround(
      forward, input,
      [this, b, runs] {
        const int next = (*runs)++ == 0 ? b + 1 : b - 1;
        const bool prefetch = next >= 0 && next < static_cast<int>(parameters_of_block_.size()) &&
                              !parameters_of_block_[next].empty();
        const Status gathered = Gather(b, prefetch ? next : -1);
        if (!gathered.ok()) throw std::runtime_error(gathered.message());
      },
      [this, b] { Release(b, /*write_back=*/false); });
}

Status ParameterShards::WithWholeParameters(const std::function<Status()>& use) {
  if (whole_depth_ == 0) {
    ENGINE_RETURN_IF_ERROR(Settle());
    for (size_t b = 0; b < parameters_of_block_.size(); ++b) {
      if (parameters_of_block_[b].empty()) continue;
      if (Status gathered = Gather(static_cast<int>(b), -1); !gathered.ok()) {
        for (size_t k = 0; k < b; ++k) Release(static_cast<int>(k), /*write_back=*/false);
        return gathered;
      }
    }
  }
  // Let go of (after writing back) the whole parameters however `use` ends, a throw included.
  struct Outermost {
    ParameterShards* shards;
    ~Outermost() {
      if (--shards->whole_depth_ > 0) return;
      for (size_t b = 0; b < shards->parameters_of_block_.size(); ++b) {
        shards->Release(static_cast<int>(b), /*write_back=*/true);
      }
    }
  };
  ++whole_depth_;
  Outermost outermost{this};
  return use();
}

int64_t ParameterShards::kept_elements() const {
  int64_t n = 0;
  for (const at::Tensor& slice : slices_) n += slice.defined() ? slice.numel() : 0;
  return n;
}

int64_t ParameterShards::block_elements() const {
  int64_t n = 0;
  for (const auto& of_block : parameters_of_block_) {
    for (size_t i : of_block) n += c10::multiply_integers(shapes_[i]);
  }
  return n;
}

}  // namespace engine
