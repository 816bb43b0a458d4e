#include "dist/nccl_group.h"

#ifdef ENGINE_WITH_NCCL
// ProcessGroupNCCL is only declared when USE_C10D_NCCL is defined; LibTorch with CUDA is built
// with it.
#define USE_C10D_NCCL 1
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "dist/c10d_group.h"
#endif

namespace engine::dist_internal {

StatusOr<std::unique_ptr<DataParallel>> MakeNcclGroup(c10::intrusive_ptr<c10d::Store> store,
                                                      const DistEnv& env, c10::Device device,
                                                      std::chrono::seconds timeout) {
  if (!device.is_cuda()) {
    return InvalidArgumentError("NCCL reduces CUDA tensors, but this stage runs on " +
                                device.str() + "; use backend GLOO (or AUTO)");
  }
#ifdef ENGINE_WITH_NCCL
  try {
    // NCCL makes its communicator on the current device; make that this rank's.
    c10::cuda::set_device(device.has_index() ? device.index() : 0);
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    auto group =
        c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.world_size, options);
    return std::unique_ptr<DataParallel>(
        new C10dDataParallel<c10d::ProcessGroupNCCL>(device, store, group));
  } catch (const std::exception& e) {
    return FailedPreconditionError("cannot make the NCCL process group: " + FirstLine(e));
  }
#else
  (void)store;
  (void)env;
  (void)timeout;
  return FailedPreconditionError(
      "this engine was built without NCCL (its LibTorch has no CUDA, or NCCL's nccl.h was not "
      "found at configure time); use backend GLOO (or AUTO)");
#endif
}

}  // namespace engine::dist_internal
