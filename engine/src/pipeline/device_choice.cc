#include "pipeline/device_choice.h"

#include <cstdlib>

#include "engine/torch_compat.h"

namespace engine {
namespace {

std::string NotADevice(const std::string& requested) {
  return "parallel.device '" + requested +
         "' is not a device; use \"cpu\", \"cuda\", \"cuda:N\" or \"auto\"";
}

// A DDP rank's own CUDA device.
StatusOr<DeviceChoice> RankDevice(const std::string& requested, const CudaDevices& cuda,
                                  const RankPlacement& rank) {
  const std::string local = "LOCAL_RANK=" + std::to_string(rank.local_rank);
  const std::string seen = std::to_string(cuda.count) + " CUDA device(s)";
  if (rank.local_rank < cuda.count) {
    return DeviceChoice{"cuda:" + std::to_string(rank.local_rank),
                        requested + ": this rank's own device (" + local + ", " + seen + ")"};
  }
  if (cuda.count == 1 && cuda.visible_devices_set) {
    return DeviceChoice{
        "cuda:0",
        requested + ": the one device CUDA_VISIBLE_DEVICES gives this rank (" + local + ")"};
  }
  return FailedPreconditionError("parallel.device '" + requested + "': this rank has " + local +
                                 ", but only " + seen +
                                 " are visible and every local rank needs its own; start at most " +
                                 std::to_string(cuda.count) + " ranks per machine, or use \"cpu\"");
}

}  // namespace

StatusOr<DeviceChoice> ChooseDeviceAmong(const std::string& requested, const CudaDevices& cuda,
                                         const std::optional<RankPlacement>& ddp) {
  const bool has_cuda = cuda.available && cuda.count > 0;
  if (requested == "auto") {
    if (!has_cuda) {
      return DeviceChoice{"cpu", "auto: no CUDA device (LibTorch " + cuda.torch_version + ")"};
    }
    if (ddp) return RankDevice(requested, cuda, *ddp);
    return DeviceChoice{"cuda:0",
                        "auto: the first of " + std::to_string(cuda.count) + " CUDA device(s)"};
  }
  if (requested == "cpu") return DeviceChoice{"cpu", "requested"};
  if (requested != "cuda" && requested.rfind("cuda:", 0) != 0) {
    return InvalidArgumentError(NotADevice(requested));
  }
  std::optional<int> index;
  if (requested.rfind("cuda:", 0) == 0) {
    const std::string digits = requested.substr(5);
    if (digits.empty() || digits.size() > 4 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgumentError(NotADevice(requested));
    }
    index = std::stoi(digits);
  }
  if (!has_cuda) {
    return FailedPreconditionError("parallel.device '" + requested +
                                   "' was requested, but this LibTorch (" + cuda.torch_version +
                                   ") has no CUDA support or sees no CUDA device; use \"cpu\" or "
                                   "\"auto\"");
  }
  if (index && ddp && ddp->world_size > 1) {
    return FailedPreconditionError(
        "parallel.device '" + requested + "' would put all " + std::to_string(ddp->world_size) +
        " ranks on one device; under DDP each rank takes its own (cuda:LOCAL_RANK): write "
        "\"cuda\" or \"auto\"");
  }
  if (!index) {
    if (ddp) return RankDevice(requested, cuda, *ddp);
    index = 0;
  }
  if (*index >= cuda.count) {
    return FailedPreconditionError("parallel.device '" + requested + "' does not exist: " +
                                   std::to_string(cuda.count) + " CUDA device(s) are visible");
  }
  return DeviceChoice{"cuda:" + std::to_string(*index), "requested"};
}

StatusOr<DeviceChoice> ChooseDevice(const std::string& requested,
                                    const std::optional<RankPlacement>& ddp) {
  CudaDevices cuda;
  cuda.available = compat::CudaAvailable();
  cuda.count = cuda.available ? compat::CudaDeviceCount() : 0;
  cuda.torch_version = compat::kTorchVersion;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  cuda.visible_devices_set = visible != nullptr && *visible != '\0';
  return ChooseDeviceAmong(requested, cuda, ddp);
}

}  // namespace engine
