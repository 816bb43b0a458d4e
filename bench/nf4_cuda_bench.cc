// The CUDA kernels against their peers on the GPU, in one process, one JSON line each:
//   - NF4 dequantize against a device-to-device copy of the same output bytes (both bandwidths,
//     bytes read + written per second, and the ratio); DequantizeNf4 straight into f32 and bf16
//     against that, and against the f32 kernel followed by a cast to bf16;
//   - the 4-bit matmul (engine::QuantizedMatmul on NF4 codes held on the GPU, bf16 compute) against
//     a dense bf16 matmul of the same shape, forward and forward + input gradient; also the same
//     forward through 1 MiB tiles (the CPU's tile size) to show why GPU tiles are larger;
//   - a few rows (1, 4, 16) straight from the NF4 codes against dequantize-then-GEMM and dense;
//   - the fused AdamW step (f32 master, bf16 gradient with its unscale factor, bf16 weight written)
//     against torch::optim::AdamW plus the casts it needs, and its bandwidth against the copy's.
// Built only when nvcc is present and LibTorch has CUDA.
//   nf4_cuda_bench [--elements N] [--repeats R] [--tokens T] [--features F]
#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/linear.h"
#include "engine/torch_compat.h"
#include "engine_kernels/fused_adamw.h"
#include "engine_kernels/nf4.h"
#include "engine_kernels/nf4_cuda.h"
#include "nf4_weight.h"

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

void MatmulBench(int64_t tokens, int64_t features, int repeats) {
  at::manual_seed(0);
  const at::Tensor dense = at::randn({features, features}) * 0.02;
  engine::kernels::Nf4Tensor q = engine::kernels::QuantizeNf4(dense, 64, false);
  q.packed = q.packed.to(at::kCUDA);
  q.absmax = q.absmax.to(at::kCUDA);
  auto weight = std::make_shared<engine::plugins::Nf4Weight>(q, at::kBFloat16);
  const auto bf16 = at::TensorOptions(at::kBFloat16).device(at::kCUDA);
  const at::Tensor w = dense.to(bf16);
  const at::Tensor x = at::randn({tokens, features}, bf16);
  const at::Tensor dy = at::randn({tokens, features}, bf16);
  const double quantized = BestSeconds(repeats, [&] { (void)engine::QuantizedMatmul(x, weight); });
  const double plain = BestSeconds(repeats, [&] { (void)at::mm(x, w.t()); });
  const int64_t small_tile = (int64_t{1} << 20) / (features * 2);
  at::Tensor y = at::empty({tokens, features}, bf16);
  const double small = BestSeconds(repeats, [&] {
    for (int64_t r = 0; r < features; r += small_tile) {
      const int64_t end = std::min(features, r + small_tile);
      at::Tensor columns = y.narrow(1, r, end - r);
      at::mm_out(columns, x, weight->DequantizeRows(r, end, at::kBFloat16).t());
    }
  });
  const at::Tensor xg = x.detach().requires_grad_();
  const double quantized_bw = BestSeconds(repeats, [&] {
    xg.mutable_grad().reset();
    engine::QuantizedMatmul(xg, weight).backward(dy);
  });
  const at::Tensor wg = w.detach();
  const double plain_bw = BestSeconds(repeats, [&] {
    xg.mutable_grad().reset();
    at::mm(xg, wg.t()).backward(dy);
  });
  const double flops = 2.0 * tokens * features * features;
  std::printf(
      "{\"bench\":\"nf4_matmul_cuda\",\"tokens\":%lld,\"features\":%lld,\"dtype\":\"bf16\","
      "\"nf4_ms\":%.3f,\"dense_ms\":%.3f,\"dense_time_vs_nf4\":%.2f,\"nf4_tflops\":%.1f,"
      "\"nf4_1mib_tiles_ms\":%.3f,\"dense_time_vs_nf4_1mib_tiles\":%.2f,"
      "\"nf4_fwd_input_grad_ms\":%.3f,\"dense_fwd_input_grad_ms\":%.3f,"
      "\"dense_time_vs_nf4_fwd_input_grad\":%.2f}\n",
      static_cast<long long>(tokens), static_cast<long long>(features), quantized * 1e3,
      plain * 1e3, plain / quantized, flops / quantized / 1e12, small * 1e3, plain / small,
      quantized_bw * 1e3, plain_bw * 1e3, plain_bw / quantized_bw);
}

// A generated token's products (1, 4 and 16 rows) through a features x features 4-bit weight:
// Nf4MatmulFewRows from the codes against dequantizing to bf16 first (DequantizeNf4, one pass),
// then a GEMM, and against a dense bf16 GEMM.
void FewRowsBench(int64_t features, int repeats) {
  at::manual_seed(0);
  const engine::kernels::Nf4Tensor q =
      engine::kernels::QuantizeNf4(at::randn({features, features}) * 0.02, 64, false);
  const at::Tensor packed = q.packed.to(at::kCUDA);
  const at::Tensor scales = q.absmax.to(at::kCUDA);
  const auto bf16 = at::TensorOptions(at::kBFloat16).device(at::kCUDA);
  const at::Tensor w = at::randn({features, features}, bf16);
  at::Tensor dequantized = at::empty({features, features}, bf16);
  for (int64_t n : {1, 4, 16}) {
    const at::Tensor x = at::randn({n, features}, bf16);
    const at::Tensor xf = x.to(at::kFloat).contiguous();
    at::Tensor y = at::empty({n, features}, bf16.dtype(at::kFloat));
    const double direct = BestSeconds(repeats, [&] {
      engine::kernels::cuda::Nf4MatmulFewRows(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(),
                                              64, features, features, xf.data_ptr<float>(), n,
                                              engine::kernels::cuda::Nf4Output::kBFloat16,
                                              y.data_ptr<float>(), nullptr);
    });
    const double tiles = BestSeconds(repeats, [&] {
      engine::kernels::cuda::DequantizeNf4(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), 64,
                                           0, features * features, dequantized.data_ptr(),
                                           engine::kernels::cuda::Nf4Output::kBFloat16, nullptr);
      (void)at::mm(x, dequantized.t());
    });
    const double dense = BestSeconds(repeats, [&] { (void)at::mm(x, w.t()); });
    std::printf(
        "{\"bench\":\"nf4_few_rows_cuda\",\"rows\":%lld,\"features\":%lld,"
        "\"from_codes_ms\":%.4f,\"dequantize_then_gemm_ms\":%.4f,\"dense_bf16_ms\":%.4f,"
        "\"speedup_over_dequantize_then_gemm\":%.2f,\"dense_time_vs_from_codes\":%.2f}\n",
        static_cast<long long>(n), static_cast<long long>(features), direct * 1e3, tiles * 1e3,
        dense * 1e3, tiles / direct, dense / direct);
  }
}

}  // namespace

// Long by design: the benchmark reads as its report, one measured figure after another, in the
// order it prints them.
int main(int argc, char** argv) {
  int64_t elements = int64_t{1} << 28;
  int repeats = 5;
  int64_t tokens = 8192, features = 4096;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--tokens") == 0) tokens = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--features") == 0) features = std::atoll(argv[i + 1]);
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

  // DequantizeNf4, one pass into the output dtype, against what engine::Linear does today for
  // bf16 (the f32 kernel, then a cast) and against copies of the same output dtype.
  using engine::kernels::cuda::Nf4Output;
  at::Tensor out16 = at::empty({elements}, f32.dtype(at::kBFloat16));
  at::Tensor source16 = at::empty({elements}, f32.dtype(at::kBFloat16)).fill_(1.0f);
  const auto direct = [&](at::Tensor& into, Nf4Output type) {
    return BestSeconds(repeats, [&] {
      engine::kernels::cuda::DequantizeNf4(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), 64,
                                           0, elements, into.data_ptr(), type, nullptr);
    });
  };
  const double direct32 = direct(out, Nf4Output::kFloat);
  const double direct16 = direct(out16, Nf4Output::kBFloat16);
  const double cast16 = BestSeconds(repeats, [&] {
    engine::kernels::cuda::DequantizeNf4F32(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(),
                                            64, 0, elements, out.data_ptr<float>(), nullptr);
    out16.copy_(out);
  });
  const double copy16 = BestSeconds(repeats, [&] { out16.copy_(source16); });
  const double in_bytes = elements / 2.0 + elements / 64 * 4.0;
  std::printf(
      "{\"bench\":\"nf4_cuda_dequantize_direct\",\"f32_ms\":%.3f,"
      "\"f32_bandwidth_vs_copy\":%.2f,\"bf16_ms\":%.3f,\"bf16_bandwidth_vs_copy\":%.2f,"
      "\"bf16_through_f32_and_cast_ms\":%.3f,\"bf16_speedup_over_f32_and_cast\":%.2f}\n",
      direct32 * 1e3, ((elements * 4.0 + in_bytes) / direct32) / (copy_bytes / copy),
      direct16 * 1e3, ((elements * 2.0 + in_bytes) / direct16) / (elements * 4.0 / copy16),
      cast16 * 1e3, cast16 / direct16);

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
  MatmulBench(tokens, features, repeats);
  FewRowsBench(features, repeats);
  return 0;
}
