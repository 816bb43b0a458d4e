#include "dist/gradient_reduce_scatter.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <string>
#include <utility>

namespace engine {
namespace {

class AccumulatedHook : public torch::autograd::PostAccumulateGradHook {
 public:
  AccumulatedHook(GradientReduceScatter* owner, size_t index) : owner_(owner), index_(index) {}
  void operator()(const torch::autograd::Variable& /*parameter*/) override {
    owner_->OnGradientAccumulated(index_);
  }

 private:
  GradientReduceScatter* owner_;
  size_t index_;
};

}  // namespace

GradientReduceScatter::GradientReduceScatter(DataParallel* group,
                                             std::vector<NamedParameter> parameters,
                                             std::shared_ptr<const ShardLayout> layout)
    : group_(group), parameters_(std::move(parameters)), layout_(std::move(layout)) {
  pieces_of_.resize(parameters_.size());
  arrived_.assign(parameters_.size(), false);
  buckets_.resize(layout_->buckets.size());
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(group_->device());
  for (size_t b = 0; b < layout_->buckets.size(); ++b) {
    const ShardLayout::Bucket& bucket = layout_->buckets[b];
    for (size_t p = 0; p < bucket.pieces.size(); ++p) {
      pieces_of_[bucket.pieces[p].parameter].push_back({b, p});
    }
    buckets_[b].out = at::empty({bucket.shard}, f32);
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(parameters_[i].tensor,
                                                   std::make_unique<AccumulatedHook>(this, i));
  }
}

GradientReduceScatter::~GradientReduceScatter() {
  for (const NamedParameter& p : parameters_) {
    torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
  }
  // c10d may still write into buffers of sends an error cut short.
  std::lock_guard<std::mutex> lock(mutex_);
  while (!in_flight_.empty()) WaitOldest();
}

void GradientReduceScatter::ArmForLastBackward() {
  std::lock_guard<std::mutex> lock(mutex_);
  ResetStep();
  armed_ = true;
}

void GradientReduceScatter::ResetStep() {
  started_ = 0;
  started_during_backward_ = 0;
  late_parameter_.clear();
  arrived_.assign(arrived_.size(), false);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].waiting = static_cast<int64_t>(layout_->buckets[b].pieces.size());
  }
}

at::Tensor GradientReduceScatter::FlatOf(size_t b) {
  Bucket& bucket = buckets_[b];
  if (!bucket.flat.defined()) {
    const ShardLayout::Bucket& shape = layout_->buckets[b];
    if (pool_.empty()) {
      pool_.push_back(at::empty({layout_->LargestShard() * layout_->world_size},
                                at::TensorOptions().dtype(at::kFloat).device(group_->device())));
    }
    bucket.buffer = std::move(pool_.back());
    pool_.pop_back();
    const int64_t padded = shape.shard * layout_->world_size;
    bucket.flat = bucket.buffer.narrow(0, 0, padded);
    bucket.flat.narrow(0, shape.elements, padded - shape.elements).zero_();
  }
  return bucket.flat;
}

void GradientReduceScatter::CopyIntoBuckets(size_t index, const at::Tensor& gradient, bool add) {
  const at::Tensor flat_gradient = gradient.defined() ? gradient.reshape({-1}) : at::Tensor();
  for (const PieceAt& at_piece : pieces_of_[index]) {
    const ShardLayout::Piece& piece = layout_->buckets[at_piece.bucket].pieces[at_piece.piece];
    at::Tensor into = FlatOf(at_piece.bucket).narrow(0, piece.at, piece.length);
    if (!flat_gradient.defined()) {
      into.zero_();
    } else if (add) {
      into.add_(flat_gradient.narrow(0, piece.from, piece.length));
    } else {
      into.copy_(flat_gradient.narrow(0, piece.from, piece.length));
    }
    if (!add) --buckets_[at_piece.bucket].waiting;
  }
}

bool GradientReduceScatter::Sent(size_t index) const {
  for (const PieceAt& at_piece : pieces_of_[index]) {
    if (buckets_.size() - 1 - at_piece.bucket < started_) return true;
  }
  return false;
}

void GradientReduceScatter::OnGradientAccumulated(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  at::Tensor& gradient = parameters_[index].tensor.mutable_grad();
  if (!armed_ || !gradient.defined()) return;
  at::NoGradGuard no_grad;
  if (arrived_[index]) {
    // A second accumulation in one backward (a re-entrant backward): added while its buckets
    // wait, else left for Finish() to refuse.
    if (Sent(index)) {
      if (late_parameter_.empty()) late_parameter_ = parameters_[index].name;
      return;
    }
    CopyIntoBuckets(index, gradient, /*add=*/true);
  } else {
    CopyIntoBuckets(index, gradient, /*add=*/false);
    arrived_[index] = true;
  }
  gradient.reset();
  StartReadyBuckets(/*all=*/false);
}

void GradientReduceScatter::StartReadyBuckets(bool all) {
  while (started_ < buckets_.size()) {
    const size_t b = buckets_.size() - 1 - started_;
    if (!all && buckets_[b].waiting > 0) break;
    if (in_flight_.size() >= static_cast<size_t>(kBucketsInFlight)) WaitOldest();
    buckets_[b].pending = group_->StartReduceScatter(FlatOf(b), buckets_[b].out);
    in_flight_.push_back(b);
    ++started_;
    if (!all) ++started_during_backward_;
  }
}

void GradientReduceScatter::WaitOldest() {
  Bucket& bucket = buckets_[in_flight_.front()];
  in_flight_.pop_front();
  Status status = bucket.pending->Wait();
  if (wire_status_.ok() && !status.ok()) wire_status_ = std::move(status);
  bucket.pending.reset();
  bucket.flat = at::Tensor();
  pool_.push_back(std::move(bucket.buffer));
  bucket.buffer = at::Tensor();
}

Status GradientReduceScatter::Finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Without an armed backward (the step's last micro-batch had no loss terms) nothing was sent.
  if (!armed_) ResetStep();
  armed_ = false;
  at::NoGradGuard no_grad;
  // Gradients the backward did not deliver: earlier micro-batches' sums, or zeros.
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (arrived_[i]) continue;
    at::Tensor& gradient = parameters_[i].tensor.mutable_grad();
    CopyIntoBuckets(i, gradient, /*add=*/false);
    gradient.reset();
  }
  StartReadyBuckets(/*all=*/true);
  while (!in_flight_.empty()) WaitOldest();
  Status status = std::move(wire_status_);
  wire_status_ = Status::Ok();
  ENGINE_RETURN_IF_ERROR(status);
  if (!late_parameter_.empty()) {
    return InternalError("the gradient of '" + late_parameter_ +
                         "' was accumulated again after its bucket was reduce-scattered");
  }
  const double scale = 1.0 / group_->world_size();
  for (Bucket& bucket : buckets_) bucket.out.mul_(scale);
  for (const ShardLayout::Part& part : layout_->parts) {
    part.view.mutable_grad() =
        buckets_[part.bucket].out.narrow(0, part.to, part.length).to(part.view.scalar_type());
  }
  return Status::Ok();
}

}  // namespace engine
