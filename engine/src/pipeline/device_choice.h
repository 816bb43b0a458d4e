// Which device a stage runs on: `parallel.device` ("auto", "cpu", "cuda", "cuda:N") resolved
// against this LibTorch and the visible CUDA devices.
//
// Under DDP every local rank takes its own device, cuda:LOCAL_RANK (F9: two ranks on one GPU is
// what NCCL refuses and what halves everyone's memory). A rank that sees a single device through
// CUDA_VISIBLE_DEVICES (a scheduler that gives every rank its own) takes that one. A rank whose
// LOCAL_RANK has no device, or a fixed "cuda:N" that would put every rank on one device, is an
// error.
//
// Pure functions of their arguments except ChooseDevice, which asks LibTorch and reads
// CUDA_VISIBLE_DEVICES; any thread.
#pragma once

#include <optional>
#include <string>

#include "engine/status.h"
#include "pipeline/resolved_pipeline.h"

namespace engine {

struct CudaDevices {
  bool available = false;  // this LibTorch has CUDA
  int count = 0;           // devices it sees
  std::string torch_version;
  // CUDA_VISIBLE_DEVICES is set: a scheduler may have given each rank its own device(s).
  bool visible_devices_set = false;
};

// Where this process sits among the ranks of a DDP stage.
struct RankPlacement {
  int local_rank = 0;
  int world_size = 1;
};

StatusOr<DeviceChoice> ChooseDeviceAmong(const std::string& requested, const CudaDevices& cuda,
                                         const std::optional<RankPlacement>& ddp);

// The same against this process's LibTorch.
StatusOr<DeviceChoice> ChooseDevice(const std::string& requested,
                                    const std::optional<RankPlacement>& ddp = std::nullopt);

}  // namespace engine
