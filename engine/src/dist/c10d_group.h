// A DataParallel over any c10d process group (Gloo's or NCCL's): what both backends do the same
// way. Internal to src/dist; the .cc that includes it must have defined the USE_C10D_* macro its
// group's header needs.
//
// Collectives that fail (a peer died, a timeout) become Aborted errors with c10d's first line.
#pragma once

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <exception>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "dist/data_parallel.h"

namespace engine::dist_internal {

// c10d's message up to its first line (the rest is a C++ backtrace).
inline std::string FirstLine(const std::exception& e) {
  std::string message = e.what();
  if (const size_t newline = message.find('\n'); newline != std::string::npos) {
    message.resize(newline);
  }
  return message;
}

template <typename F>
Status Collective(const char* what, F&& body) {
  try {
    body();
    return Status::Ok();
  } catch (const std::exception& e) {
    return AbortedError(
        std::string("data parallel ") + what +
        " failed (another rank probably died; its error says why): " + FirstLine(e));
  }
}

struct C10dPendingSum : DataParallel::PendingSum {
  Status Wait() override {
    ENGINE_RETURN_IF_ERROR(started);
    return Collective(what, [&] { work->wait(); });
  }
  std::vector<at::Tensor> tensors;  // what c10d reduces in place; kept alive until Wait()
  c10::intrusive_ptr<c10d::Work> work;
  Status started;
  const char* what = "gradient all-reduce";  // for the error
};

// A reduce-scatter done as an all-reduce of the whole tensor, of which Wait() keeps this rank's
// slice.
struct C10dPendingSlice : C10dPendingSum {
  Status Wait() override {
    ENGINE_RETURN_IF_ERROR(C10dPendingSum::Wait());
    shard.copy_(tensors[0].narrow(0, rank * shard.numel(), shard.numel()));
    return Status::Ok();
  }
  at::Tensor shard;
  int rank = 0;
};

// How StartReduceScatter reduces: with the group's reduce-scatter, or (Gloo, whose reduce-scatter
// took 2.1x its all-reduce's time on 2 CPU ranks, and 1.2x at 4 MiB) with an all-reduce of which
// each rank keeps its slice: the same sum, and the buffer is the caller's already.
enum class ReduceScatterBy { kReduceScatter, kAllReduce };

template <typename Group>
class C10dDataParallel : public DataParallel {
 public:
  C10dDataParallel(c10::Device device, c10::intrusive_ptr<c10d::Store> store,
                   c10::intrusive_ptr<Group> group,
                   ReduceScatterBy reduce_scatter_by = ReduceScatterBy::kReduceScatter)
      : device_(device),
        store_(std::move(store)),
        group_(std::move(group)),
        reduce_scatter_by_(reduce_scatter_by) {}

  int rank() const override { return group_->getRank(); }
  int world_size() const override { return group_->getSize(); }
  c10::Device device() const override { return device_; }

  std::unique_ptr<PendingSum> StartSum(at::Tensor flat) override {
    auto pending = std::make_unique<C10dPendingSum>();
    pending->tensors = {std::move(flat)};
    pending->started = Collective("gradient all-reduce",
                                  [&] { pending->work = group_->allreduce(pending->tensors); });
    return pending;
  }

  std::unique_ptr<PendingSum> StartReduceScatter(at::Tensor whole, at::Tensor shard) override {
    if (reduce_scatter_by_ == ReduceScatterBy::kAllReduce) {
      auto pending = std::make_unique<C10dPendingSlice>();
      pending->tensors = {std::move(whole)};
      pending->shard = std::move(shard);
      pending->rank = rank();
      pending->what = "gradient reduce-scatter";
      pending->started = Collective("gradient reduce-scatter",
                                    [&] { pending->work = group_->allreduce(pending->tensors); });
      return pending;
    }
    auto pending = std::make_unique<C10dPendingSum>();
    pending->tensors = {std::move(whole), std::move(shard)};
    pending->what = "gradient reduce-scatter";
    pending->started = Collective("gradient reduce-scatter", [&] {
      pending->work = group_->_reduce_scatter_base(pending->tensors[1], pending->tensors[0]);
    });
    return pending;
  }

  Status AllGather(const at::Tensor& shard, const at::Tensor& whole) override {
    return Collective("all-gather", [&] {
      at::Tensor input = shard;
      at::Tensor output = whole;
      group_->_allgather_base(output, input)->wait();
    });
  }

  std::unique_ptr<PendingSum> StartAllGather(at::Tensor shard, at::Tensor whole) override {
    auto pending = std::make_unique<C10dPendingSum>();
    pending->tensors = {std::move(whole), std::move(shard)};
    pending->what = "all-gather";
    pending->started = Collective("all-gather", [&] {
      pending->work = group_->_allgather_base(pending->tensors[0], pending->tensors[1]);
    });
    return pending;
  }

  StatusOr<std::vector<double>> Max(const std::vector<double>& values) override {
    return Reduce(values, c10d::ReduceOp::MAX, "flag all-reduce");
  }

  StatusOr<std::vector<double>> Sum(const std::vector<double>& values) override {
    return Reduce(values, c10d::ReduceOp::SUM, "metric all-reduce");
  }

  // An all-reduce of one number, read back on the host: no rank passes before every rank arrived.
  // (c10d's own barrier would have NCCL guess a device.)
  Status Barrier() override { return Reduce({0.0}, c10d::ReduceOp::SUM, "barrier").status(); }

 private:
  StatusOr<std::vector<double>> Reduce(const std::vector<double>& values, c10d::ReduceOp op,
                                       const char* what) {
    const int64_t n = static_cast<int64_t>(values.size());
    // A copy even on the CPU: from_blob's memory is the caller's, and c10d reduces in place.
    std::vector<at::Tensor> t = {at::from_blob(const_cast<double*>(values.data()), {n}, at::kDouble)
                                     .to(device_, at::kDouble, /*non_blocking=*/false,
                                         /*copy=*/true)};
    c10d::AllreduceOptions options;
    options.reduceOp = op;
    at::Tensor host;
    ENGINE_RETURN_IF_ERROR(Collective(what, [&] {
      group_->allreduce(t, options)->wait();
      host = t[0].to(at::kCPU).contiguous();  // waits for the device
    }));
    const double* reduced = host.data_ptr<double>();
    return std::vector<double>(reduced, reduced + n);
  }

  c10::Device device_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Group> group_;
  ReduceScatterBy reduce_scatter_by_;
};

}  // namespace engine::dist_internal
