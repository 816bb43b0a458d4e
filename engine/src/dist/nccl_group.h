// NCCL's process group for DataParallel, kept in its own file because its header needs NCCL's and
// CUDA's: compiled where the build found them (ENGINE_WITH_NCCL), an error naming the way out
// elsewhere. Internal to src/dist.
#pragma once

#include <chrono>
#include <memory>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dist/data_parallel.h"

namespace engine::dist_internal {

// A group whose collectives run on CUDA device `device` (one device per rank).
StatusOr<std::unique_ptr<DataParallel>> MakeNcclGroup(c10::intrusive_ptr<c10d::Store> store,
                                                      const DistEnv& env, c10::Device device,
                                                      std::chrono::seconds timeout);

}  // namespace engine::dist_internal
