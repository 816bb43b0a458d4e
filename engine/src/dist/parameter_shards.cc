#include "dist/parameter_shards.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/module.h>

#include <stdexcept>

#include "engine/activation_checkpoint.h"

namespace engine {
namespace {

at::Tensor Flat(const at::Tensor& t) { return t.view({-1}); }

}  // namespace

ParameterShards::ParameterShards(DataParallel* group, std::vector<NamedParameter> parameters)
    : group_(group), parameters_(std::move(parameters)) {}

ParameterShards::~ParameterShards() = default;

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
  for (size_t b = 0; b < blocks.size(); ++b) shards->Release(static_cast<int>(b), false);
  return shards;
}

at::Tensor& ParameterShards::GatherBuffer(at::ScalarType dtype) {
  at::Tensor& buffer = gather_buffers_[dtype];
  if (!buffer.defined()) {
    int64_t shard = 0;
    for (const ShardLayout::Bucket& bucket : layout_->buckets) {
      if (bucket.block >= 0 && bucket.dtype == dtype) shard = std::max(shard, bucket.shard);
    }
    buffer = at::empty({shard * group_->world_size()},
                       at::TensorOptions().dtype(dtype).device(group_->device()));
  }
  return buffer;
}

Status ParameterShards::Gather(int b) {
  at::NoGradGuard no_grad;
  std::map<size_t, at::Tensor> whole;
  for (size_t i : parameters_of_block_[b]) {
    whole[i] = at::empty(shapes_[i], parameters_[i].tensor.options().requires_grad(false));
  }
  for (size_t k : buckets_of_block_[b]) {
    const ShardLayout::Bucket& bucket = layout_->buckets[k];
    at::Tensor gathered =
        GatherBuffer(bucket.dtype).narrow(0, 0, bucket.shard * group_->world_size());
    at::Tensor slice = slices_[k];
    if (slice.device() != group_->device()) slice = slice.to(group_->device());
    ENGINE_RETURN_IF_ERROR(
        group_->AllGather(slice, gathered)
            .WithContext("gathering the parameters of block '" + block_names_[b] + "'"));
    for (const ShardLayout::Piece& piece : bucket.pieces) {
      Flat(whole[piece.parameter])
          .narrow(0, piece.from, piece.length)
          .copy_(gathered.narrow(0, piece.at, piece.length));
    }
  }
  for (auto& [i, tensor] : whole) parameters_[i].tensor.set_data(tensor);
  return Status::Ok();
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
  return CheckpointedForwardAround(
      forward, input,
      [this, b] {
        const Status gathered = Gather(b);
        if (!gathered.ok()) throw std::runtime_error(gathered.message());
      },
      [this, b] { Release(b, /*write_back=*/false); });
}

Status ParameterShards::WithWholeParameters(const std::function<Status()>& use) {
  if (whole_depth_ == 0) {
    for (size_t b = 0; b < parameters_of_block_.size(); ++b) {
      ENGINE_RETURN_IF_ERROR(Gather(static_cast<int>(b)));
    }
  }
  ++whole_depth_;
  const Status status = use();
  if (--whole_depth_ == 0) {
    for (size_t b = 0; b < parameters_of_block_.size(); ++b) {
      Release(static_cast<int>(b), /*write_back=*/true);
    }
  }
  return status;
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
