// A DataParallel for unit tests: this process is rank 0 of two, and the other rank's side of
// every collective is scripted (a constant added to gradient sums, fixed values for Max and Sum,
// its shard of an all-gather the same as ours).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/data_parallel.h"

namespace engine::testing {

class FakeDataParallel : public DataParallel {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }

  std::unique_ptr<PendingSum> StartSum(at::Tensor flat) override {
    started_sizes.push_back(flat.numel());
    const float other = other_gradient;
    return Pending("all-reduce", [flat, other] { flat.add_(other); });
  }

  // Rank 0's slice of the sum, the other rank adding `other_gradient` to every element.
  std::unique_ptr<PendingSum> StartReduceScatter(at::Tensor whole, at::Tensor shard) override {
    started_sizes.push_back(whole.numel());
    const float other = other_gradient;
    return Pending("reduce-scatter", [whole, shard, other] {
      shard.copy_(whole.narrow(0, 0, shard.numel()));
      shard.add_(other);
    });
  }

  // The other rank holds the same shard (a stand-in: tests of what is gathered need real ranks).
  Status AllGather(const at::Tensor& shard, const at::Tensor& whole) override {
    if (fail_waits) return AbortedError("data parallel all-gather failed: peer gone");
    const int64_t n = shard.numel();
    whole.narrow(0, 0, n).copy_(shard);
    whole.narrow(0, n, n).copy_(shard);
    return Status::Ok();
  }

  // The other rank's values are `other_max` / `other_sum` where set, else the same as ours.
  StatusOr<std::vector<double>> Max(const std::vector<double>& values) override {
    std::vector<double> out = values;
    for (size_t i = 0; i < out.size() && i < other_max.size(); ++i) {
      out[i] = std::max(out[i], other_max[i]);
    }
    return out;
  }
  StatusOr<std::vector<double>> Sum(const std::vector<double>& values) override {
    sums.push_back(values);
    std::vector<double> out = values;
    for (size_t i = 0; i < out.size(); ++i)
      out[i] += i < other_sum.size() ? other_sum[i] : values[i];
    return out;
  }
  Status Barrier() override { return Status::Ok(); }

  float other_gradient = 0;  // every element of the other rank's gradients
  bool fail_waits = false;
  std::vector<double> other_max, other_sum;
  std::vector<int64_t> started_sizes;     // StartSum and StartReduceScatter calls, in order
  std::vector<std::vector<double>> sums;  // Sum calls

 private:
  // A sum whose Wait() runs `finish`, or fails as a dead peer would when fail_waits was set.
  std::unique_ptr<PendingSum> Pending(const std::string& what, std::function<void()> finish) {
    struct Scripted : PendingSum {
      Status Wait() override {
        if (fail) return AbortedError("data parallel gradient " + what + " failed: peer gone");
        finish();
        return Status::Ok();
      }
      std::string what;
      std::function<void()> finish;
      bool fail = false;
    };
    auto pending = std::make_unique<Scripted>();
    pending->what = what;
    pending->finish = std::move(finish);
    pending->fail = fail_waits;
    return pending;
  }
};

}  // namespace engine::testing
