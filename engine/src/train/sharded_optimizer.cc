#include "train/sharded_optimizer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

namespace engine {
namespace {

class ShardedOptimizer : public Optimizer {
 public:
  ShardedOptimizer(const proto::Optimizer& config, std::vector<NamedParameter> parameters,
                   std::vector<at::ScalarType> master_dtypes, DataParallel* group,
                   std::shared_ptr<const ShardLayout> layout, ShardedGradients gradients)
      : parameters_(std::move(parameters)),
        master_dtypes_(std::move(master_dtypes)),
        group_(group),
        layout_(std::move(layout)),
        buckets_(layout_->buckets),
        parts_(layout_->parts),
        gradients_(gradients) {
    if (master_dtypes_.empty())
      master_dtypes_.assign(parameters_.size(), at::ScalarType::Undefined);
    // The plain optimizer, over this rank's parts: their views, which it updates in place (and
    // whose .grad() it reads at level 2), or the parts' masters. It keeps slots for them only.
    at::NoGradGuard no_grad;
    std::vector<NamedParameter> updated;
    masters_.resize(parts_.size());
    for (size_t k = 0; k < parts_.size(); ++k) {
      if (HasMaster(parts_[k].parameter)) {
        masters_[k] = parts_[k].view.to(master_dtypes_[parts_[k].parameter]).clone();
      }
      updated.push_back({PartName(k), masters_[k].defined() ? masters_[k] : parts_[k].view});
    }
    inner_ = MakeOptimizer(config, std::move(updated));
  }

  std::string algorithm() const override { return inner_->algorithm(); }
  std::vector<std::string> slot_names() const override { return inner_->slot_names(); }
  // Whole state exists on no rank: checkpoints hold StateParts() of every rank.
  safetensors::NamedTensors State() const override { return {}; }
  bool sharded() const override { return true; }

  PiecesToWrite StateParts() const override {
    PiecesToWrite out;
    const safetensors::NamedTensors mine = inner_->State();
    const std::map<std::string, at::Tensor> by_name(mine.begin(), mine.end());
    auto add = [&](size_t k, const std::string& suffix, at::Tensor values) {
      const Part& part = parts_[k];
      const std::string name = parameters_[part.parameter].name + "." + suffix;
      out.pieces.emplace_back(PieceName(name, part.from), values.reshape({-1}));
      out.shapes[name] = layout_->shapes[part.parameter];
    };
    // Before the first update there are no slots on any rank (steps were skipped, or none was
    // taken); the masters exist from the start.
    const std::vector<std::string> slots =
        steps_ > 0 ? inner_->slot_names() : std::vector<std::string>();
    for (size_t k = 0; k < parts_.size(); ++k) {
      for (const std::string& slot : slots) {
        // A part without slots (its parameter never had a gradient here) is stored as zeros, so
        // the ranks' pieces still cover the parameter.
        auto it = by_name.find(PartName(k) + "." + slot);
        add(k, slot,
            it != by_name.end()
                ? it->second
                : at::zeros({parts_[k].length},
                            parts_[k].view.options().dtype(UpdatedDtype(parts_[k].parameter))));
      }
      if (masters_[k].defined()) add(k, "master", masters_[k]);
    }
    // A parameter without elements has no parts on any rank: rank 0 writes its empty pieces, so
    // that the checkpoint still names its state.
    for (size_t i = 0; group_->rank() == 0 && i < parameters_.size(); ++i) {
      if (c10::multiply_integers(layout_->shapes[i]) > 0) continue;
      std::vector<std::string> suffixes = slots;
      if (HasMaster(i)) suffixes.push_back("master");
      for (const std::string& suffix : suffixes) {
        const std::string name = parameters_[i].name + "." + suffix;
        out.pieces.emplace_back(PieceName(name, 0),
                                at::empty({0}, at::TensorOptions().dtype(UpdatedDtype(i))));
        out.shapes[name] = layout_->shapes[i];
      }
    }
    return out;
  }

  Status LoadState(const safetensors::NamedTensors& state, int64_t steps) override {
    return LoadStatePieces(TensorPieces::FromWhole(state), steps);
  }

  // Each part's elements, from wherever the state holds them (whole, or the pieces of any number
  // of ranks).
  Status LoadStatePieces(const TensorPieces& state, int64_t steps) override {
    ENGINE_RETURN_IF_ERROR(CheckState(state));
    safetensors::NamedTensors mine;
    at::NoGradGuard no_grad;
    for (size_t k = 0; k < parts_.size(); ++k) {
      const Part& part = parts_[k];
      const std::string& name = parameters_[part.parameter].name;
      if (masters_[k].defined() && state.Has(name + ".master")) {
        ENGINE_RETURN_IF_ERROR(state.ReadInto(name + ".master", part.from, masters_[k]));
      }
      for (const std::string& slot : inner_->slot_names()) {
        if (!state.Has(name + "." + slot)) break;  // this parameter never had a gradient
        at::Tensor values =
            at::empty({part.length}, part.view.options().dtype(UpdatedDtype(part.parameter)));
        ENGINE_RETURN_IF_ERROR(state.ReadInto(name + "." + slot, part.from, values));
        mine.emplace_back(PartName(k) + "." + slot, std::move(values));
      }
    }
    ENGINE_RETURN_IF_ERROR(inner_->LoadState(mine, steps));
    steps_ = steps;
    return Status::Ok();
  }

 protected:
  void Update(double lr, const std::vector<GradientFeed>& feeds) override {
    at::NoGradGuard no_grad;
    ++steps_;
    // This rank's parts, updated by the plain optimizer with the gradients, factors and
    // write-backs the whole parameters would get; a master's update is written back into its part
    // of the parameter.
    if (gradients_ == ShardedGradients::kInParts) {
      inner_->Step(lr, feeds);
    } else {
      inner_->Step(lr, PartFeeds(feeds));
    }
    // Every rank's parts into every rank's parameters, then any other low-precision copies. A
    // block's buckets at shard_level 3 stay in parts until the block runs
    // (dist/parameter_shards.h).
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (buckets_[b].block >= 0) continue;
      StatusOr<at::Tensor> whole =
          GatherBucket(b, buckets_[b].dtype, [&](size_t k) { return parts_[k].view; });
      if (!whole.ok()) throw std::runtime_error(whole.status().message());
      for (const Piece& piece : buckets_[b].pieces) {
        Flat(parameters_[piece.parameter])
            .narrow(0, piece.from, piece.length)
            .copy_(whole->narrow(0, piece.at, piece.length));
      }
    }
    if (gradients_ == ShardedGradients::kInParts) return;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const GradientFeed g = GradientOf(parameters_[i].tensor, i, feeds);
      if (g.write_back.defined() && !g.write_back.is_same(parameters_[i].tensor)) {
        g.write_back.copy_(parameters_[i].tensor);
      }
    }
  }

 private:
  using Piece = ShardLayout::Piece;
  using Bucket = ShardLayout::Bucket;
  using Part = ShardLayout::Part;

  // Level 1: the feeds of this rank's parts, cut from the whole parameters' gradients.
  std::vector<GradientFeed> PartFeeds(const std::vector<GradientFeed>& feeds) const {
    std::vector<GradientFeed> part_feeds(parts_.size());
    for (size_t k = 0; k < parts_.size(); ++k) {
      const Part& part = parts_[k];
      const GradientFeed g = GradientOf(parameters_[part.parameter].tensor, part.parameter, feeds);
      if (!g.grad.defined()) continue;  // the part's own .grad() is undefined too: not updated
      part_feeds[k].grad = g.grad.reshape({-1}).narrow(0, part.from, part.length);
      part_feeds[k].scale = g.scale;
      if (masters_[k].defined()) {
        part_feeds[k].write_back = part.view;
      } else if (g.write_back.defined() && g.write_back.is_contiguous()) {
        part_feeds[k].write_back = Flat(g.write_back).narrow(0, part.from, part.length);
      }
    }
    return part_feeds;
  }

  // What a bucket is all-gathered through, for the largest bucket of a dtype; kept from step to
  // step, since buffers of a bucket's size freed and allocated again grow the C heap.
  struct GatherBuffers {
    at::Tensor slice;
    at::Tensor whole;
  };

  static std::string PartName(size_t k) { return "part" + std::to_string(k); }
  static std::string JoinSlots(const std::vector<std::string>& slots) {
    std::string out;
    for (const std::string& slot : slots) out += (out.empty() ? "" : ", ") + slot;
    return out;
  }
  bool HasMaster(size_t i) const { return master_dtypes_[i] != at::ScalarType::Undefined; }
  // The dtype of what the optimizer updates for parameter i: its master's, or its own.
  at::ScalarType UpdatedDtype(size_t i) const {
    return HasMaster(i) ? master_dtypes_[i] : parameters_[i].tensor.scalar_type();
  }

  // A parameter as one dimension, sharing its memory (the trainer's tensors are contiguous).
  static at::Tensor Flat(const at::Tensor& t) { return t.view({-1}); }
  static at::Tensor Flat(const NamedParameter& p) { return Flat(p.tensor); }

  // Bucket b whole in `dtype` on the parameters' device (a view of a buffer there when it is the
  // group's, valid until the next call): each rank sends its slice, made of part_tensor(k) for its
  // parts k (undefined: zeros), zeros in the padding.
  StatusOr<at::Tensor> GatherBucket(size_t b, at::ScalarType dtype,
                                    const std::function<at::Tensor(size_t)>& part_tensor) {
    const Bucket& bucket = buckets_[b];
    const GatherBuffers& buffers = BuffersFor(dtype);
    at::Tensor slice = buffers.slice.narrow(0, 0, bucket.shard);
    at::Tensor whole = buffers.whole.narrow(0, 0, bucket.shard * group_->world_size());
    slice.zero_();
    for (size_t k : bucket.parts) {
      const at::Tensor part = part_tensor(k);
      if (part.defined()) slice.narrow(0, parts_[k].to, parts_[k].length).copy_(part);
    }
    ENGINE_RETURN_IF_ERROR(group_->AllGather(slice, whole));
    const c10::Device device = parameters_[bucket.pieces.front().parameter].tensor.device();
    return whole.device() == device ? whole : whole.to(device);
  }

  // Buffers for the largest bucket, in `dtype`, made on first use and kept.
  const GatherBuffers& BuffersFor(at::ScalarType dtype) {
    auto it = buffers_.find(dtype);
    if (it != buffers_.end()) return it->second;
    const int64_t shard = layout_->LargestShard();
    const auto options = at::TensorOptions().device(group_->device()).dtype(dtype);
    return buffers_[dtype] = {at::empty({shard}, options),
                              at::empty({shard * group_->world_size()}, options)};
  }

  // The same checks as the plain optimizer's LoadState, on the whole state.
  Status CheckState(const TensorPieces& state) const {
    std::set<std::string> known;
    const std::vector<std::string> slots = inner_->slot_names();
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const std::string& name = parameters_[i].name;
      const std::vector<int64_t>& shape = layout_->shapes[i];
      size_t present = 0;
      for (const std::string& slot : slots) {
        if (!state.Has(name + "." + slot)) continue;
        if (state.shape(name + "." + slot) != shape) {
          return DataLossError("optimizer state '" + name + "." + slot + "' has the wrong shape");
        }
        known.insert(name + "." + slot);
        ++present;
      }
      if (present > 0 && present < slots.size()) {
        return DataLossError("optimizer state for '" + name + "' lacks one of its slots (" +
                             JoinSlots(slots) + ")");
      }
      if (!HasMaster(i)) continue;
      const std::string master = name + ".master";
      if (!state.Has(master)) {
        if (!state.names().empty()) {
          return DataLossError("the f32 master '" + master + "' is missing");
        }
        continue;
      }
      if (state.dtype(master) != master_dtypes_[i] || state.shape(master) != shape) {
        return DataLossError("the master '" + master +
                             "' has another dtype or shape than this stage's");
      }
      known.insert(master);
    }
    for (const std::string& name : state.names()) {
      if (known.count(name) == 0) {
        return DataLossError("optimizer state holds '" + name +
                             "', which matches no trainable parameter");
      }
    }
    return Status::Ok();
  }

  std::vector<NamedParameter> parameters_;
  std::vector<at::ScalarType> master_dtypes_;  // per parameter; Undefined: none
  DataParallel* group_;
  std::shared_ptr<const ShardLayout> layout_;
  const std::vector<Bucket>& buckets_;  // layout_'s
  const std::vector<Part>& parts_;      // layout_'s
  ShardedGradients gradients_;
  std::vector<at::Tensor> masters_;  // per part; undefined where its parameter has no master
  std::map<at::ScalarType, GatherBuffers> buffers_;
  std::unique_ptr<Optimizer> inner_;  // over views of parts_
};

}  // namespace

StatusOr<std::shared_ptr<const ShardLayout>> LayOutShards(
    const std::vector<NamedParameter>& parameters, const DataParallel& group,
    int64_t bucket_bytes) {
  std::vector<at::Tensor> tensors;
  for (const NamedParameter& p : parameters) {
    if (!p.tensor.is_contiguous()) {
      return FailedPreconditionError("the sharded optimizer updates parts of '" + p.name +
                                     "' in place, and it is not contiguous in memory");
    }
    tensors.push_back(p.tensor);
  }
  return std::make_shared<const ShardLayout>(
      MakeShardLayout(tensors, group.world_size(), group.rank(), bucket_bytes));
}

StatusOr<std::unique_ptr<Optimizer>> MakeShardedOptimizer(const proto::Optimizer& config,
                                                          std::vector<NamedParameter> parameters,
                                                          std::vector<at::ScalarType> master_dtypes,
                                                          DataParallel* group,
                                                          std::shared_ptr<const ShardLayout> layout,
                                                          ShardedGradients gradients) {
  if (!master_dtypes.empty() && master_dtypes.size() != parameters.size()) {
    return InternalError("the sharded optimizer got " + std::to_string(master_dtypes.size()) +
                         " master dtypes for " + std::to_string(parameters.size()) + " parameters");
  }
  return std::unique_ptr<Optimizer>(new ShardedOptimizer(config, std::move(parameters),
                                                         std::move(master_dtypes), group,
                                                         std::move(layout), gradients));
}

StatusOr<std::unique_ptr<Optimizer>> MakeShardedOptimizer(const proto::Optimizer& config,
                                                          std::vector<NamedParameter> parameters,
                                                          std::vector<at::ScalarType> master_dtypes,
                                                          DataParallel* group,
                                                          int64_t bucket_bytes) {
  ENGINE_ASSIGN_OR_RETURN(std::shared_ptr<const ShardLayout> layout,
                          LayOutShards(parameters, *group, bucket_bytes));
  return MakeShardedOptimizer(config, std::move(parameters), std::move(master_dtypes), group,
                              std::move(layout), ShardedGradients::kWhole);
}

}  // namespace engine
