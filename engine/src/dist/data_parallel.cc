// Gloo's process group is only declared when USE_C10D_GLOO is defined; Debian's and pip's LibTorch
// are both built with it.
#define USE_C10D_GLOO 1
#include "dist/data_parallel.h"

#include <ATen/ops/from_blob.h>

#include <exception>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace engine {
namespace {

template <typename F>
Status Collective(const char* what, F&& body) {
  try {
    body();
    return Status::Ok();
  } catch (const std::exception& e) {
    std::string message = e.what();
    if (const size_t newline = message.find('\n'); newline != std::string::npos) {
      message.resize(newline);
    }
    return AbortedError(std::string("data parallel ") + what +
                        " failed (another rank probably died; its error says why): " + message);
  }
}

struct GlooPendingSum : DataParallel::PendingSum {
  Status Wait() override {
    ENGINE_RETURN_IF_ERROR(started);
    return Collective("gradient all-reduce", [&] { work->wait(); });
  }
  std::vector<at::Tensor> tensors;  // what c10d reduces in place; kept alive until Wait()
  c10::intrusive_ptr<c10d::Work> work;
  Status started;
};

class GlooDataParallel : public DataParallel {
 public:
  GlooDataParallel(c10::intrusive_ptr<c10d::Store> store,
                   c10::intrusive_ptr<c10d::ProcessGroupGloo> group)
      : store_(std::move(store)), group_(std::move(group)) {}

  int rank() const override { return group_->getRank(); }
  int world_size() const override { return group_->getSize(); }

  std::unique_ptr<PendingSum> StartSum(at::Tensor flat) override {
    auto pending = std::make_unique<GlooPendingSum>();
    pending->tensors = {std::move(flat)};
    pending->started = Collective("gradient all-reduce",
                                  [&] { pending->work = group_->allreduce(pending->tensors); });
    return pending;
  }

  StatusOr<std::vector<double>> Max(const std::vector<double>& values) override {
    return Reduce(values, c10d::ReduceOp::MAX, "flag all-reduce");
  }

  StatusOr<std::vector<double>> Sum(const std::vector<double>& values) override {
    return Reduce(values, c10d::ReduceOp::SUM, "metric all-reduce");
  }

  Status Barrier() override {
    return Collective("barrier", [&] { group_->barrier()->wait(); });
  }

 private:
  StatusOr<std::vector<double>> Reduce(const std::vector<double>& values, c10d::ReduceOp op,
                                       const char* what) {
    const int64_t n = static_cast<int64_t>(values.size());
    std::vector<at::Tensor> t = {
        at::from_blob(const_cast<double*>(values.data()), {n}, at::kDouble).clone()};
    c10d::AllreduceOptions options;
    options.reduceOp = op;
    ENGINE_RETURN_IF_ERROR(Collective(what, [&] { group_->allreduce(t, options)->wait(); }));
    const double* reduced = t[0].data_ptr<double>();
    std::vector<double> out(reduced, reduced + n);
    return out;
  }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
};

}  // namespace

StatusOr<DataParallel*> DataParallel::Connect(const DistEnv& env, std::chrono::seconds timeout) {
  static std::unique_ptr<DataParallel> connected;
  if (connected != nullptr) {
    if (connected->world_size() != env.world_size || connected->rank() != env.rank) {
      return InternalError("the process group was made for another rank or world size");
    }
    return connected.get();
  }
  const std::string where = "rank " + std::to_string(env.rank) + " of " +
                            std::to_string(env.world_size) + " at MASTER_ADDR=" + env.master_addr +
                            " MASTER_PORT=" + std::to_string(env.master_port);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(env.master_port);
    options.isServer = env.rank == 0;
    options.numWorkers = static_cast<size_t>(env.world_size);
    options.timeout = timeout;
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    std::string message = e.what();
    if (const size_t newline = message.find('\n'); newline != std::string::npos) {
      message.resize(newline);
    }
    if (env.rank == 0 && message.find("in use") != std::string::npos) {
      return FailedPreconditionError(where + ": port " + std::to_string(env.master_port) +
                                     " is already in use; free it or set MASTER_PORT to another "
                                     "(`engine run --nproc` picks a free one when MASTER_PORT is "
                                     "unset): " +
                                     message);
    }
    return FailedPreconditionError(where + ": cannot reach the rendezvous: " + message);
  }
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    // Ranks on one machine talk over loopback; across machines, over the interface of this
    // machine's hostname.
    const bool loopback = env.master_addr == "localhost" || env.master_addr.rfind("127.", 0) == 0;
    options->devices.push_back(loopback
                                   ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                   : c10d::ProcessGroupGloo::createDefaultDevice());
    auto group =
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world_size, options);
    connected = std::make_unique<GlooDataParallel>(store, group);
  } catch (const std::exception& e) {
    return FailedPreconditionError(
        where + ": cannot make the Gloo process group: " + std::string(e.what()));
  }
  return connected.get();
}

}  // namespace engine
