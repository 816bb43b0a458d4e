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
    std::vector<NamedParameter> slices;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      slices.push_back({BucketName(b), buckets_[b].weights});
    }
    inner_ = MakeOptimizer(config, std::move(slices));
  }

  std::string algorithm() const override { return inner_->algorithm(); }
  std::vector<std::string> slot_names() const override { return inner_->slot_names(); }
  safetensors::NamedTensors State() const override { return gathered_; }

  Status GatherState() override {
    gathered_.clear();
    const safetensors::NamedTensors slices = inner_->State();
    if (slices.empty()) return Status::Ok();  // no step yet, on every rank
    const std::map<std::string, at::Tensor> by_name(slices.begin(), slices.end());
    at::NoGradGuard no_grad;
    for (const std::string& slot : inner_->slot_names()) {
      for (size_t b = 0; b < buckets_.size(); ++b) {
        auto it = by_name.find(BucketName(b) + "." + slot);
        if (it == by_name.end()) {
          return InternalError("sharded optimizer: no '" + slot + "' for bucket " +
                               std::to_string(b));
        }
        ENGINE_ASSIGN_OR_RETURN(at::Tensor whole, Gather(it->second));
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
    safetensors::NamedTensors slices;
    if (!state.empty()) {
      at::NoGradGuard no_grad;
      for (size_t b = 0; b < buckets_.size(); ++b) {
        for (const std::string& slot : inner_->slot_names()) {
          // A parameter without state never had a gradient: its moments are zeros.
          at::Tensor slice = at::zeros({buckets_[b].shard}, buckets_[b].weights.options());
          ForEachOwnedPart(b, [&](size_t i, int64_t from, int64_t to, int64_t length) {
            auto it = by_name.find(parameters_[i].name + "." + slot);
            if (it == by_name.end()) return;
            slice.narrow(0, to, length).copy_(it->second.reshape({-1}).narrow(0, from, length));
          });
          slices.emplace_back(BucketName(b) + "." + slot, std::move(slice));
        }
      }
    }
    ENGINE_RETURN_IF_ERROR(inner_->LoadState(slices, steps));
    steps_ = steps;
    return Status::Ok();
  }

 protected:
  void Update(double lr, const std::vector<GradientFeed>& feeds) override {
    at::NoGradGuard no_grad;
    ++steps_;
    gathered_.clear();
    std::vector<GradientFeed> slice_feeds(buckets_.size());
    for (size_t b = 0; b < buckets_.size(); ++b) {
      Bucket& bucket = buckets_[b];
      ForEachOwnedPart(b, [&](size_t i, int64_t from, int64_t to, int64_t length) {
        const at::Tensor& p = parameters_[i].tensor;
        bucket.weights.narrow(0, to, length).copy_(p.reshape({-1}).narrow(0, from, length));
        const GradientFeed g = GradientOf(p, i, feeds);
        at::Tensor gradient = bucket.gradient.narrow(0, to, length);
        if (!g.grad.defined()) {
          gradient.zero_();
          return;
        }
        gradient.copy_(g.grad.reshape({-1}).narrow(0, from, length));
        if (g.scale != 1.0) gradient.mul_(g.scale);
      });
      slice_feeds[b].grad = bucket.gradient;
    }
    inner_->Step(lr, slice_feeds);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      StatusOr<at::Tensor> whole = Gather(buckets_[b].weights);
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
  // Parameters [first, last), end to end from `offsets`; `weights` and `gradient` are this rank's
  // slice of them (`shard` elements, in the parameters' dtype, on their device).
  struct Bucket {
    size_t first = 0;
    size_t last = 0;
    std::vector<int64_t> offsets;
    int64_t elements = 0;
    int64_t shard = 0;
    at::Tensor weights;
    at::Tensor gradient;
  };

  static std::string BucketName(size_t b) { return "bucket" + std::to_string(b); }

  void Pack(int64_t bucket_bytes) {
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const at::Tensor& p = parameters_[i].tensor;
      const int64_t size = static_cast<int64_t>(p.element_size());
      const bool fresh = buckets_.empty() ||
                         buckets_.back().weights.scalar_type() != p.scalar_type() ||
                         (buckets_.back().elements > 0 &&
                          (buckets_.back().elements + p.numel()) * size > bucket_bytes);
      if (fresh) {
        buckets_.emplace_back();
        buckets_.back().first = i;
        // A placeholder that carries the dtype and device until the bucket is sized.
        buckets_.back().weights = at::empty({0}, p.options().requires_grad(false));
      }
      Bucket& bucket = buckets_.back();
      bucket.offsets.push_back(bucket.elements);
      bucket.elements += p.numel();
      bucket.last = i + 1;
    }
    const int64_t world = group_->world_size();
    for (Bucket& bucket : buckets_) {
      bucket.shard = (bucket.elements + world - 1) / world;
      bucket.weights = at::zeros({bucket.shard}, bucket.weights.options());
      bucket.gradient = at::zeros({bucket.shard}, bucket.weights.options());
    }
  }

  // Calls part(i, from, to, length) for each parameter i of bucket b with elements in this rank's
  // slice: `length` of them from element `from` of the parameter go to element `to` of the slice.
  void ForEachOwnedPart(size_t b,
                        const std::function<void(size_t, int64_t, int64_t, int64_t)>& part) const {
    const Bucket& bucket = buckets_[b];
    const int64_t lo = group_->rank() * bucket.shard;
    const int64_t hi = lo + bucket.shard;
    for (size_t i = bucket.first; i < bucket.last; ++i) {
      const int64_t start = bucket.offsets[i - bucket.first];
      const int64_t begin = std::max(lo, start);
      const int64_t end = std::min(hi, start + parameters_[i].tensor.numel());
      if (begin < end) part(i, begin - start, begin - lo, end - begin);
    }
  }

  // Every rank's `slice`, end to end, on the slice's device.
  StatusOr<at::Tensor> Gather(const at::Tensor& slice) {
    const c10::Device where = group_->device();
    const at::Tensor shard = slice.device() == where ? slice : slice.to(where);
    at::Tensor whole = at::empty({shard.numel() * group_->world_size()}, shard.options());
    ENGINE_RETURN_IF_ERROR(group_->AllGather(shard, whole));
    return whole.device() == slice.device() ? whole : whole.to(slice.device());
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
  std::unique_ptr<Optimizer> inner_;  // over the buckets' slices
  safetensors::NamedTensors gathered_;
};

}  // namespace

std::unique_ptr<Optimizer> MakeShardedOptimizer(const proto::Optimizer& config,
                                                std::vector<NamedParameter> parameters,
                                                DataParallel* group, int64_t bucket_bytes) {
  return std::make_unique<ShardedOptimizer>(config, std::move(parameters), group, bucket_bytes);
}

}  // namespace engine
