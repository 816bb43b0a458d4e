// Gloo's process group is only declared when USE_C10D_GLOO is defined; Debian's and pip's LibTorch
// are both built with it.
#define USE_C10D_GLOO 1
#include "dist/data_parallel.h"

#include <map>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dist/c10d_group.h"
#include "dist/nccl_group.h"

namespace engine {
namespace {

using dist_internal::FirstLine;

StatusOr<std::unique_ptr<DataParallel>> MakeGlooGroup(c10::intrusive_ptr<c10d::Store> store,
                                                      const DistEnv& env,
                                                      std::chrono::seconds timeout) {
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
    return std::unique_ptr<DataParallel>(
        new dist_internal::C10dDataParallel<c10d::ProcessGroupGloo>(
            c10::Device(c10::kCPU), store, group, dist_internal::ReduceScatterBy::kAllReduce));
  } catch (const std::exception& e) {
    return FailedPreconditionError("cannot make the Gloo process group: " + FirstLine(e));
  }
}

// What this process connected to: the rendezvous store and a group per backend on it.
struct Connection {
  int rank = -1;
  int world_size = 0;
  c10::intrusive_ptr<c10d::Store> store;
  std::map<DdpBackend, std::unique_ptr<DataParallel>> groups;
};

}  // namespace

const char* BackendName(DdpBackend backend) {
  return backend == DdpBackend::kNccl ? "NCCL" : "Gloo";
}

bool NcclBuiltIn() {
#ifdef ENGINE_WITH_NCCL
  return true;
#else
  return false;
#endif
}

StatusOr<DataParallel*> DataParallel::Connect(const DistEnv& env, DdpBackend backend,
                                              c10::Device device, std::chrono::seconds timeout) {
  static Connection connection;
  const std::string where = "rank " + std::to_string(env.rank) + " of " +
                            std::to_string(env.world_size) + " at MASTER_ADDR=" + env.master_addr +
                            " MASTER_PORT=" + std::to_string(env.master_port);
  if (connection.store) {
    if (connection.world_size != env.world_size || connection.rank != env.rank) {
      return InternalError("the process group was made for another rank or world size");
    }
    auto it = connection.groups.find(backend);
    if (it != connection.groups.end()) {
      if (it->second->device() != device) {
        return FailedPreconditionError(where + ": this process's " + BackendName(backend) +
                                       " group reduces on " + it->second->device().str() +
                                       ", but this stage runs on " + device.str() +
                                       "; every DDP stage of a run must use the same device");
      }
      return it->second.get();
    }
  } else {
    try {
      c10d::TCPStoreOptions options;
      options.port = static_cast<uint16_t>(env.master_port);
      options.isServer = env.rank == 0;
      options.numWorkers = static_cast<size_t>(env.world_size);
      options.timeout = timeout;
      connection.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    } catch (const std::exception& e) {
      const std::string message = FirstLine(e);
      if (env.rank == 0 && message.find("in use") != std::string::npos) {
        return FailedPreconditionError(where + ": port " + std::to_string(env.master_port) +
                                       " is already in use; free it or set MASTER_PORT to another "
                                       "(`engine run --nproc` picks a free one when MASTER_PORT is "
                                       "unset): " +
                                       message);
      }
      return FailedPreconditionError(where + ": cannot reach the rendezvous: " + message);
    }
    connection.rank = env.rank;
    connection.world_size = env.world_size;
  }
  // Each backend's group keeps its keys apart from the other's on the one store.
  auto store = c10::make_intrusive<c10d::PrefixStore>(BackendName(backend), connection.store);
  StatusOr<std::unique_ptr<DataParallel>> group =
      backend == DdpBackend::kNccl ? dist_internal::MakeNcclGroup(store, env, device, timeout)
                                   : MakeGlooGroup(store, env, timeout);
  if (!group.ok()) return FailedPreconditionError(where + ": " + group.status().message());
  DataParallel* made = group->get();
  connection.groups[backend] = std::move(*group);
  return made;
}

namespace {

// A collective already done: Wait() returns how it went.
class DonePending : public DataParallel::PendingSum {
 public:
  explicit DonePending(Status status) : status_(std::move(status)) {}
  Status Wait() override { return status_; }

 private:
  Status status_;
};

}  // namespace

std::unique_ptr<DataParallel::PendingSum> DataParallel::StartAllGather(at::Tensor shard,
                                                                       at::Tensor whole) {
  return std::make_unique<DonePending>(AllGather(shard, whole));
}

}  // namespace engine
