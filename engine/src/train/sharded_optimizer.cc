#include "train/sharded_optimizer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

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
                   DataParallel* group, int64_t bucket_bytes)
      : parameters_(std::move(parameters)), group_(group) {
    Pack(bucket_bytes);
    // The plain optimizer, over views of this rank's parts of the parameters: it updates them in
    // place and keeps slots for them only.
    std::vector<NamedParameter> views;
    for (size_t k = 0; k < parts_.size(); ++k) {
      views.push_back(
          {PartName(k),
           Flat(parameters_[parts_[k].parameter]).narrow(0, parts_[k].from, parts_[k].length)});
    }
    inner_ = MakeOptimizer(config, std::move(views));
  }

  std::string algorithm() const override { return inner_->algorithm(); }
  std::vector<std::string> slot_names() const override { return inner_->slot_names(); }
  safetensors::NamedTensors State() const override { return gathered_; }

  Status GatherState() override {
    gathered_.clear();
    if (steps_ == 0) return Status::Ok();  // no slots yet, on any rank
    const safetensors::NamedTensors mine = inner_->State();
    const std::map<std::string, at::Tensor> by_name(mine.begin(), mine.end());
    at::NoGradGuard no_grad;
    for (const std::string& slot : inner_->slot_names()) {
      for (size_t b = 0; b < buckets_.size(); ++b) {
        // A part without slots (its parameter never had a gradient) sends zeros.
        ENGINE_ASSIGN_OR_RETURN(at::Tensor whole, GatherBucket(b, [&](size_t k) {
                                  auto it = by_name.find(PartName(k) + "." + slot);
                                  return it == by_name.end() ? at::Tensor() : it->second;
                                }));
        if (group_->rank() != 0) continue;
        const Bucket& bucket = buckets_[b];
        for (size_t i = bucket.first; i < bucket.last; ++i) {
          const at::Tensor& p = parameters_[i].tensor;
          gathered_.emplace_back(
              parameters_[i].name + "." + slot,
              whole.narrow(0, bucket.offsets[i - bucket.first], p.numel()).view(p.sizes()).clone());
        }
      }
    }
    return Status::Ok();
  }

  Status LoadState(const safetensors::NamedTensors& state, int64_t steps) override {
    gathered_.clear();
    const std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
    ENGINE_RETURN_IF_ERROR(CheckState(by_name));
    safetensors::NamedTensors mine;
    for (size_t k = 0; k < parts_.size(); ++k) {
      const Part& part = parts_[k];
      for (const std::string& slot : inner_->slot_names()) {
        auto it = by_name.find(parameters_[part.parameter].name + "." + slot);
        if (it == by_name.end()) break;  // this parameter never had a gradient
        mine.emplace_back(PartName(k) + "." + slot,
                          it->second.reshape({-1}).narrow(0, part.from, part.length));
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
    gathered_.clear();
    // This rank's parts, updated in place by the plain optimizer with the same gradients, factors
    // and write-backs the whole parameters would get.
    std::vector<GradientFeed> part_feeds(parts_.size());
    for (size_t k = 0; k < parts_.size(); ++k) {
      const Part& part = parts_[k];
      const GradientFeed g = GradientOf(parameters_[part.parameter].tensor, part.parameter, feeds);
      if (!g.grad.defined()) continue;  // a view's own .grad() is undefined too: not updated
      part_feeds[k].grad = g.grad.reshape({-1}).narrow(0, part.from, part.length);
      part_feeds[k].scale = g.scale;
      if (g.write_back.defined() && g.write_back.is_contiguous()) {
        part_feeds[k].write_back = Flat(g.write_back).narrow(0, part.from, part.length);
      }
    }
    inner_->Step(lr, part_feeds);
    // Every rank's parts into every rank's parameters (and their low-precision copies).
    for (size_t b = 0; b < buckets_.size(); ++b) {
      StatusOr<at::Tensor> whole = GatherBucket(b, [&](size_t k) {
        return Flat(parameters_[parts_[k].parameter]).narrow(0, parts_[k].from, parts_[k].length);
      });
      if (!whole.ok()) throw std::runtime_error(whole.status().message());
      const Bucket& bucket = buckets_[b];
      for (size_t i = bucket.first; i < bucket.last; ++i) {
        at::Tensor& p = parameters_[i].tensor;
        const at::Tensor updated =
            whole->narrow(0, bucket.offsets[i - bucket.first], p.numel()).view(p.sizes());
        p.copy_(updated);
        const GradientFeed g = GradientOf(p, i, feeds);
        if (g.write_back.defined()) g.write_back.copy_(updated);
      }
    }
  }

 private:
  // Parameters [first, last), end to end from `offsets`, `elements` in all; each rank's slice is
  // `shard` elements (the last one padded).
  struct Bucket {
    size_t first = 0;
    size_t last = 0;
    std::vector<int64_t> offsets;
    int64_t elements = 0;
    int64_t shard = 0;
    at::ScalarType dtype = at::kFloat;
    std::vector<size_t> parts;  // this rank's, in slice order
  };
  // `length` elements of parameter `parameter` from its element `from`, at element `to` of this
  // rank's slice of the parameter's bucket.
  struct Part {
    size_t bucket = 0;
    size_t parameter = 0;
    int64_t from = 0;
    int64_t to = 0;
    int64_t length = 0;
  };

  static std::string PartName(size_t k) { return "part" + std::to_string(k); }
  // A parameter as one dimension, sharing its memory (the trainer's tensors are contiguous).
  static at::Tensor Flat(const at::Tensor& t) { return t.view({-1}); }
  static at::Tensor Flat(const NamedParameter& p) { return Flat(p.tensor); }

  void Pack(int64_t bucket_bytes) {
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const at::Tensor& p = parameters_[i].tensor;
      const int64_t size = static_cast<int64_t>(p.element_size());
      if (buckets_.empty() || buckets_.back().dtype != p.scalar_type() ||
          (buckets_.back().elements > 0 &&
           (buckets_.back().elements + p.numel()) * size > bucket_bytes)) {
        buckets_.emplace_back();
        buckets_.back().first = i;
        buckets_.back().dtype = p.scalar_type();
      }
      Bucket& bucket = buckets_.back();
      bucket.offsets.push_back(bucket.elements);
      bucket.elements += p.numel();
      bucket.last = i + 1;
    }
    const int64_t world = group_->world_size();
    for (size_t b = 0; b < buckets_.size(); ++b) {
      Bucket& bucket = buckets_[b];
      bucket.shard = (bucket.elements + world - 1) / world;
      const int64_t lo = group_->rank() * bucket.shard;
      const int64_t hi = lo + bucket.shard;
      for (size_t i = bucket.first; i < bucket.last; ++i) {
        const int64_t start = bucket.offsets[i - bucket.first];
        const int64_t begin = std::max(lo, start);
        const int64_t end = std::min(hi, start + parameters_[i].tensor.numel());
        if (begin >= end) continue;
        bucket.parts.push_back(parts_.size());
        parts_.push_back({b, i, begin - start, begin - lo, end - begin});
      }
    }
  }

  // Bucket b whole on this rank's device: each rank sends its slice, made of part_tensor(k) for
  // its parts k (undefined: zeros), zeros in the padding.
  StatusOr<at::Tensor> GatherBucket(size_t b,
                                    const std::function<at::Tensor(size_t)>& part_tensor) {
    const Bucket& bucket = buckets_[b];
    const at::Tensor& first = parameters_[bucket.first].tensor;
    const c10::Device where = group_->device();
    at::Tensor slice = at::zeros({bucket.shard}, first.options().device(where));
    for (size_t k : bucket.parts) {
      const at::Tensor part = part_tensor(k);
      if (part.defined()) slice.narrow(0, parts_[k].to, parts_[k].length).copy_(part);
    }
    at::Tensor whole = at::empty({bucket.shard * group_->world_size()}, slice.options());
    ENGINE_RETURN_IF_ERROR(group_->AllGather(slice, whole));
    return whole.device() == first.device() ? whole : whole.to(first.device());
  }

  // The same checks as the plain optimizer's LoadState, on the whole state.
  Status CheckState(const std::map<std::string, at::Tensor>& by_name) const {
    std::set<std::string> known;
    const std::vector<std::string> slots = inner_->slot_names();
    for (const NamedParameter& p : parameters_) {
      size_t present = 0;
      for (const std::string& slot : slots) {
        auto it = by_name.find(p.name + "." + slot);
        if (it == by_name.end()) continue;
        if (!it->second.sizes().equals(p.tensor.sizes())) {
          return DataLossError("optimizer state '" + it->first + "' has the wrong shape");
        }
        known.insert(it->first);
        ++present;
      }
      if (present > 0 && present < slots.size()) {
        return DataLossError("optimizer state for '" + p.name + "' lacks one of its slots");
      }
    }
    for (const auto& [name, tensor] : by_name) {
      if (known.count(name) == 0) {
        return DataLossError("optimizer state holds '" + name +
                             "', which matches no trainable parameter");
      }
    }
    return Status::Ok();
  }

  std::vector<NamedParameter> parameters_;
  DataParallel* group_;
  std::vector<Bucket> buckets_;
  std::vector<Part> parts_;
  std::unique_ptr<Optimizer> inner_;  // over views of parts_
  safetensors::NamedTensors gathered_;
};

}  // namespace

StatusOr<std::unique_ptr<Optimizer>> MakeShardedOptimizer(const proto::Optimizer& config,
                                                          std::vector<NamedParameter> parameters,
                                                          DataParallel* group,
                                                          int64_t bucket_bytes) {
  for (const NamedParameter& p : parameters) {
    if (!p.tensor.is_contiguous()) {
      return FailedPreconditionError("the sharded optimizer updates parts of '" + p.name +
                                     "' in place, and it is not contiguous in memory");
    }
  }
  return std::unique_ptr<Optimizer>(
      new ShardedOptimizer(config, std::move(parameters), group, bucket_bytes));
}

}  // namespace engine
