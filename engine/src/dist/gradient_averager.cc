#include "dist/gradient_averager.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>

#include <utility>

namespace engine {

GradientAverager::GradientAverager(DataParallel* group, std::vector<NamedParameter> parameters,
                                   int64_t bucket_bytes)
    : group_(group), parameters_(std::move(parameters)) {
  const size_t n = parameters_.size();
  bucket_of_.resize(n);
  offset_.resize(n);
  arrived_.assign(n, false);
  const at::TensorOptions bucket_options =
      at::TensorOptions().dtype(at::kFloat).device(group_->device());
  int64_t bucket_elements = 0;
  for (size_t k = n; k-- > 0;) {
    const int64_t numel = parameters_[k].tensor.numel();
    if (buckets_.empty() || (bucket_elements > 0 && (bucket_elements + numel) * 4 > bucket_bytes)) {
      if (!buckets_.empty()) {
        buckets_.back().flat = at::empty({bucket_elements}, bucket_options);
      }
      buckets_.emplace_back();
      bucket_elements = 0;
    }
    bucket_of_[k] = buckets_.size() - 1;
    offset_[k] = bucket_elements;
    buckets_.back().members.push_back(k);
    bucket_elements += numel;
  }
  if (!buckets_.empty()) buckets_.back().flat = at::empty({bucket_elements}, bucket_options);
  hooks_.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    hooks_.push_back(parameters_[k].tensor.register_hook(
        [this, k](const at::Tensor& gradient) { OnGradient(k, gradient); }));
  }
}

GradientAverager::~GradientAverager() {
  for (size_t k = 0; k < hooks_.size(); ++k) parameters_[k].tensor.remove_hook(hooks_[k]);
}

at::Tensor GradientAverager::Slice(size_t index) {
  return buckets_[bucket_of_[index]].flat.narrow(0, offset_[index],
                                                 parameters_[index].tensor.numel());
}

void GradientAverager::ArmForLastBackward() {
  std::lock_guard<std::mutex> lock(mutex_);
  ResetStep();
  armed_ = true;
}

void GradientAverager::ResetStep() {
  next_bucket_ = 0;
  started_during_backward_ = 0;
  arrived_.assign(arrived_.size(), false);
  for (Bucket& bucket : buckets_) {
    bucket.waiting = static_cast<int64_t>(bucket.members.size());
    bucket.pending.reset();
  }
}

void GradientAverager::OnGradient(size_t index, const at::Tensor& incoming) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_ || bucket_of_[index] < next_bucket_) return;
  at::NoGradGuard no_grad;
  at::Tensor slice = Slice(index);
  if (arrived_[index]) {
    slice.add_(incoming.reshape({-1}).to(slice.device(), at::kFloat));
    return;
  }
  // The hook runs before autograd adds `incoming` to .grad; earlier micro-batches are already
  // there. Summing in the gradient's dtype gives what .grad will hold.
  const at::Tensor& accumulated = parameters_[index].tensor.grad();
  slice.copy_((accumulated.defined() ? at::add(accumulated, incoming) : incoming).reshape({-1}));
  arrived_[index] = true;
  if (--buckets_[bucket_of_[index]].waiting == 0) StartReadyBuckets(/*all=*/false);
}

void GradientAverager::StartReadyBuckets(bool all) {
  while (next_bucket_ < buckets_.size() && (all || buckets_[next_bucket_].waiting == 0)) {
    Bucket& bucket = buckets_[next_bucket_];
    bucket.pending = group_->StartSum(bucket.flat);
    if (!all) ++started_during_backward_;
    ++next_bucket_;
  }
}

Status GradientAverager::Finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Without an armed backward (the step's last micro-batch had no loss terms) nothing was started.
  if (!armed_) ResetStep();
  at::NoGradGuard no_grad;
  // Gradients the backward did not deliver: earlier micro-batches' sums, or zeros.
  for (size_t b = next_bucket_; b < buckets_.size(); ++b) {
    for (size_t k : buckets_[b].members) {
      if (arrived_[k]) continue;
      const at::Tensor& accumulated = parameters_[k].tensor.grad();
      if (accumulated.defined()) {
        Slice(k).copy_(accumulated.reshape({-1}));
      } else {
        Slice(k).zero_();
      }
    }
  }
  StartReadyBuckets(/*all=*/true);
  armed_ = false;
  const double scale = 1.0 / group_->world_size();
  Status status;
  for (Bucket& bucket : buckets_) {
    if (status.ok()) status = bucket.pending->Wait();
    bucket.pending.reset();
  }
  ENGINE_RETURN_IF_ERROR(status);
  for (Bucket& bucket : buckets_) bucket.flat.mul_(scale);
  for (size_t k = 0; k < parameters_.size(); ++k) {
    at::Tensor& gradient = parameters_[k].tensor.mutable_grad();
    if (!gradient.defined()) gradient = at::zeros_like(parameters_[k].tensor);
    gradient.copy_(Slice(k).view(gradient.sizes()));
  }
  return Status::Ok();
}

}  // namespace engine
