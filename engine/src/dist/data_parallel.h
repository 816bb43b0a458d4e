// The ranks of a data-parallel stage and what they do together, over a c10d process group (Gloo
// on the CPU, NCCL on CUDA devices): summing tensors asynchronously, whole or each rank its slice
// (GradientAverager and GradientReduceScatter build gradient buckets on them), gathering the parts
// of a sharded optimizer, agreeing on whether to stop, and waiting for each other around
// checkpoints.
//
// One rendezvous store per process and one group per backend, made on first use from DistEnv and
// kept until exit (c10d groups are not meant to be torn down and rebuilt). Every collective must be
// called by every rank in the same order; a rank that dies makes the others fail within `timeout`
// instead of hanging.
//
// Thread safety: the training thread only (StartSum also from autograd's threads, one at a time).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <vector>

#include "dist/dist_env.h"
#include "engine/status.h"

namespace engine {

enum class DdpBackend { kGloo, kNccl };

// "Gloo" or "NCCL".
const char* BackendName(DdpBackend backend);

// Whether this engine was built with c10d's NCCL process group (a LibTorch with CUDA whose NCCL
// headers were found at configure time).
bool NcclBuiltIn();

class DataParallel {
 public:
  virtual ~DataParallel() = default;

  // The process's group for `backend`, connecting on the first call (rank 0 serves the rendezvous
  // store at MASTER_ADDR:MASTER_PORT). NCCL reduces tensors on `device`, which must be a CUDA
  // device; Gloo on the CPU. A busy port, an unreachable master or a backend this build lacks is an
  // error naming them.
  static StatusOr<DataParallel*> Connect(const DistEnv& env, DdpBackend backend, c10::Device device,
                                         std::chrono::seconds timeout);

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Where the tensors given to StartSum must live.
  virtual c10::Device device() const { return c10::Device(c10::kCPU); }

  // Starts summing `flat` (a contiguous f32 or f64 tensor on device()) over the ranks and returns
  // at once; the sum is in `flat` when Wait() returns Ok (on a CUDA device: for work queued on the
  // current stream after Wait()). Every rank must start the same sums in the same order. `flat`
  // must stay alive and untouched until then.
  class PendingSum {
   public:
    virtual ~PendingSum() = default;
    virtual Status Wait() = 0;
  };
  virtual std::unique_ptr<PendingSum> StartSum(at::Tensor flat) = 0;

  // Starts summing `whole` (contiguous f32 on device(), world_size() times the size of `shard`)
  // over the ranks into this rank's slice of the sum: `shard` gets elements [rank * n, (rank + 1) *
  // n) of it, n being its size, when Wait() returns Ok. Both must stay alive and untouched until
  // then; the same order rule as StartSum's.
  virtual std::unique_ptr<PendingSum> StartReduceScatter(at::Tensor whole, at::Tensor shard) = 0;

  // Copies every rank's `shard` (contiguous, on device(), of the same dtype and size on every rank)
  // into `whole` (contiguous, world_size() times as many elements; rank r's at r times the shard's
  // size) and returns when it is there (on a CUDA device: for work queued on the current stream
  // after it returns).
  virtual Status AllGather(const at::Tensor& shard, const at::Tensor& whole) = 0;
  // AllGather started and returned at once; `whole` holds every rank's shard when Wait() returns
  // Ok. Both must stay alive and untouched until then; the same order rule as StartSum's. By
  // default it gathers before returning.
  virtual std::unique_ptr<PendingSum> StartAllGather(at::Tensor shard, at::Tensor whole);

  // Element-wise maximum over ranks of small flags (stop requested, interrupted, ...).
  virtual StatusOr<std::vector<double>> Max(const std::vector<double>& values) = 0;
  // Element-wise sum over ranks of a few numbers (evaluation partial sums), in f64.
  virtual StatusOr<std::vector<double>> Sum(const std::vector<double>& values) = 0;

  virtual Status Barrier() = 0;
};

}  // namespace engine
