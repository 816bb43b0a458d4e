// The CUDA kernels against their peers on the GPU, in one process, one JSON line each:
//   - NF4 dequantize against a device-to-device copy of the same output bytes (both bandwidths,
//     bytes read + written per second, and the ratio);
//   - the fused AdamW step (f32 master, bf16 gradient with its unscale factor, bf16 weight written)
//     against torch::optim::AdamW plus the casts it needs, and its bandwidth against the copy's.
// Built only when nvcc is present and LibTorch has CUDA.
//   nf4_cuda_bench [--elements N] [--repeats R]
#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/torch_compat.h"
#include "engine_kernels/fused_adamw.h"
#include "engine_kernels/nf4.h"
#include "engine_kernels/nf4_cuda.h"

namespace {

template <typename Fn>
double BestSeconds(int repeats, Fn&& fn) {
  fn();
  torch::cuda::synchronize();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) fn();
    torch::cuda::synchronize();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 10;
    if (s < best) best = s;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t elements = int64_t{1} << 28;
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--elements") == 0) elements = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::atoi(argv[i + 1]);
  }
  if (!engine::compat::CudaAvailable()) {
    std::fprintf(stderr, "nf4_cuda_bench: no CUDA device\n");
    return 1;
  }
  using engine::kernels::Nf4Tensor;
  const Nf4Tensor q = engine::kernels::QuantizeNf4(at::randn({elements}), 64, false);
  const at::Tensor packed = q.packed.to(at::kCUDA);
  const at::Tensor scales = q.absmax.to(at::kCUDA);
  const auto f32 = at::TensorOptions(at::kFloat).device(at::kCUDA);
  at::Tensor out = at::empty({elements}, f32);
  at::Tensor source = at::empty({elements}, f32).fill_(1.0f);
  const double dequant = BestSeconds(repeats, [&] {
    engine::kernels::cuda::DequantizeNf4F32(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(),
                                            64, 0, elements, out.data_ptr<float>(), nullptr);
  });
  const double copy = BestSeconds(repeats, [&] { out.copy_(source); });
  const double dequant_bytes = elements * 4.0 + elements / 2.0 + elements / 64 * 4.0;
  const double copy_bytes = elements * 8.0;
  std::printf(
      "{\"bench\":\"nf4_cuda_dequantize\",\"elements\":%lld,\"dequant_ms\":%.3f,"
      "\"dequant_gbps\":%.1f,\"copy_ms\":%.3f,\"copy_gbps\":%.1f,"
      "\"dequant_time_vs_copy_of_output\":%.2f,\"dequant_bandwidth_vs_copy\":%.2f}\n",
      static_cast<long long>(elements), dequant * 1e3, dequant_bytes / dequant / 1e9, copy * 1e3,
      copy_bytes / copy / 1e9, copy / dequant, (dequant_bytes / dequant) / (copy_bytes / copy));

  // AdamW over `elements` parameters.
  at::Tensor master = at::randn({elements}, f32);
  const at::Tensor grad = (at::randn({elements}, f32) * 1024).to(at::kBFloat16);
  at::Tensor m = at::zeros({elements}, f32), v = at::zeros({elements}, f32);
  at::Tensor low = at::empty({elements}, f32.dtype(at::kBFloat16));
  engine::kernels::AdamWHyper hyper;
  const double fused = BestSeconds(repeats, [&] {
    ++hyper.step;
    engine::kernels::FusedAdamW(master, grad, m, v, hyper, 1.0 / 1024, low);
  });
  at::Tensor p = master.clone();
  torch::optim::AdamW optimizer({p}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  const double peer = BestSeconds(repeats, [&] {
    p.mutable_grad() = grad.to(at::kFloat).mul_(1.0 / 1024);
    optimizer.step();
    low.copy_(p);
  });
  // Bytes the fused pass must move: read p, m, v, g; write p, m, v, low.
  const double adamw_bytes = elements * (4.0 * 3 * 2 + 2 + 2);
  std::printf(
      "{\"bench\":\"fused_adamw_cuda\",\"elements\":%lld,\"fused_ms\":%.3f,\"fused_gbps\":%.1f,"
      "\"libtorch_ms\":%.3f,\"libtorch_time_vs_fused\":%.2f,\"fused_bandwidth_vs_copy\":%.2f}\n",
      static_cast<long long>(elements), fused * 1e3, adamw_bytes / fused / 1e9, peer * 1e3,
      peer / fused, (adamw_bytes / fused) / (copy_bytes / copy));
  return 0;
}
