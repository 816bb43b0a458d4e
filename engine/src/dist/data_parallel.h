// The ranks of a data-parallel stage and what they do together, over a c10d process group (Gloo
// on the CPU): summing tensors asynchronously (GradientAverager builds gradient buckets on it),
// agreeing on whether to stop, and waiting for each other around checkpoints.
//
// One process group per process, made on first use from DistEnv and kept until exit (c10d groups
// are not meant to be torn down and rebuilt). Every collective must be called by every rank in the
// same order; a rank that dies makes the others fail within `timeout` instead of hanging.
//
// Thread safety: the training thread only.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <vector>

#include "dist/dist_env.h"
#include "engine/status.h"

namespace engine {

class DataParallel {
 public:
  virtual ~DataParallel() = default;

  // The process's group, connecting on the first call (rank 0 serves the rendezvous store at
  // MASTER_ADDR:MASTER_PORT). A busy port or an unreachable master is an error naming them.
  static StatusOr<DataParallel*> Connect(const DistEnv& env, std::chrono::seconds timeout);

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Starts summing `flat` (a contiguous f32 tensor) over the ranks and returns at once; the sum
  // is in `flat` when Wait() returns Ok. Every rank must start the same sums in the same order.
  // `flat` must stay alive and untouched until then.
  class PendingSum {
   public:
    virtual ~PendingSum() = default;
    virtual Status Wait() = 0;
  };
  virtual std::unique_ptr<PendingSum> StartSum(at::Tensor flat) = 0;

  // Element-wise maximum over ranks of small flags (stop requested, interrupted, ...).
  virtual StatusOr<std::vector<double>> Max(const std::vector<double>& values) = 0;
  // Element-wise sum over ranks of a few numbers (evaluation partial sums), in f64.
  virtual StatusOr<std::vector<double>> Sum(const std::vector<double>& values) = 0;

  virtual Status Barrier() = 0;
};

}  // namespace engine
