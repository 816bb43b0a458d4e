// The quantization kernels against their dense peers, in one process:
//
//   build/bin/quant_bench [--rows 4096] [--cols 4096] [--tokens 256] [--params 16777216]
//                         [--repeats 5]
//
//   dequantize: NF4 -> bf16 and -> f32 of a rows x cols weight (double-quantized scales, block 64)
//               in the 4-bit matmul's 1 MiB row tiles, against memcpy of the same number of output
//               bytes; ratio = memcpy time / dequant time (1.00: dequantizing at memory-copy
//               speed).
//   matmul:     x [tokens, cols] @ W^T through engine::QuantizedMatmul (tiles dequantized into the
//               compute dtype, then GEMM; up to 16 tokens, straight from the codes where that is
//               faster) against at::matmul with the dense W already in that dtype; ratio = dense
//               time / 4-bit time (forward only, and forward + input grad). Up to 16 tokens a
//               "tiles" row times the tiled path too (ENGINE_CPU_KERNELS=0).
//   adamw:      one step over --params f32 masters with bf16 gradients: the fused kernel (reads
//               the bf16 gradient, writes master, moments and the bf16 copy in one pass) against
//               torch::optim::AdamW plus the casts it needs (gradient to f32 before, weight to
//               bf16 after); ratio = LibTorch time / fused time. Then the engine's step for a
//               bf16 weight under loss scaling: the gradient fed to the fused kernel with its
//               unscale factor against casting, unscaling and checking it in f32 first.
// Best of --repeats for each. Single process, whatever threads LibTorch uses (printed), with the
// engine's allocator settings.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "best_time.h"
#include "core/allocator.h"
#include "engine/few_rows_matmul.h"
#include "engine/linear.h"
#include "engine_kernels/cpu_kernels_switch.h"
#include "engine_kernels/fused_adamw.h"
#include "engine_kernels/nf4.h"
#include "nf4_weight.h"

using engine::bench::BestSeconds;

// Long by design: the benchmark reads as its report, one measured figure after another, in the
// order it prints them.
int main(int argc, char** argv) {
  int64_t rows = 4096, cols = 4096, tokens = 256, params = 1 << 24;
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--rows") rows = std::stoll(argv[i + 1]);
    if (arg == "--cols") cols = std::stoll(argv[i + 1]);
    if (arg == "--tokens") tokens = std::stoll(argv[i + 1]);
    if (arg == "--params") params = std::stoll(argv[i + 1]);
    if (arg == "--repeats") repeats = std::atoi(argv[i + 1]);
  }
  // As `engine run` does: freed memory stays in the process, so a fresh output is not a fresh mmap
  // paid in page faults (the memcpy peer writes into a buffer it already touched).
  engine::ConfigureAllocatorForTraining();
  at::manual_seed(0);
  const at::Tensor dense = at::randn({rows, cols}) * 0.02;
  const auto q = engine::kernels::QuantizeNf4(dense, 64, /*double_quant=*/true);
  std::printf("weight %lld x %lld, NF4 block 64 double-quantized (%.3f bits/weight), %d threads\n",
              static_cast<long long>(rows), static_cast<long long>(cols),
              8.0 * q.storage_bytes() / dense.numel(), at::get_num_threads());

  std::printf("\n%-22s %10s %10s %8s %10s\n", "dequantize", "ms", "memcpy ms", "ratio", "GB/s out");
  for (c10::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    const int64_t bytes = dense.numel() * static_cast<int64_t>(c10::elementSize(dtype));
    std::vector<char> src(bytes, 1), dst(bytes);
    const double copy = BestSeconds(repeats, [&] { std::memcpy(dst.data(), src.data(), bytes); });
    // Tile by tile, 1 MiB of output each, as the 4-bit matmul dequantizes (engine/src/core/
    // linear.cc): what the engine pays, without the page faults of one huge fresh output.
    const int64_t tile =
        std::max<int64_t>(1, (int64_t{1} << 20) / (cols * c10::elementSize(dtype)));
    const double dq = BestSeconds(repeats, [&] {
      for (int64_t r = 0; r < rows; r += tile) {
        (void)engine::kernels::DequantizeNf4Range(q, r * cols, std::min(rows, r + tile) * cols,
                                                  dtype);
      }
    });
    std::printf("%-22s %10.3f %10.3f %8.2f %10.2f\n",
                (std::string("nf4 -> ") + c10::toString(dtype)).c_str(), dq * 1e3, copy * 1e3,
                copy / dq, bytes / dq / 1e9);
  }

  std::printf("\n%-22s %10s %10s %8s\n", "matmul", "4-bit ms", "dense ms", "ratio");
  for (c10::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    auto weight = std::make_shared<engine::plugins::Nf4Weight>(q, dtype);
    const at::Tensor w = dense.to(dtype);
    const at::Tensor x = at::randn({tokens, cols}).to(dtype);
    const at::Tensor dy = at::randn({tokens, rows}).to(dtype);
    const double quantized =
        BestSeconds(repeats, [&] { (void)engine::QuantizedMatmul(x, weight); });
    const double plain = BestSeconds(repeats, [&] { (void)at::matmul(x, w.t()); });
    std::printf("%-22s %10.3f %10.3f %8.2f\n",
                (std::string("forward ") + c10::toString(dtype)).c_str(), quantized * 1e3,
                plain * 1e3, plain / quantized);
    if (tokens <= engine::FewRowsMatmul::kMaxRows) {
      // The same through the dequantized tiles, which the few-rows path replaces.
      ::setenv(engine::kernels::kCpuKernelsVariable, "0", 1);
      const double tiled = BestSeconds(repeats, [&] { (void)engine::QuantizedMatmul(x, weight); });
      ::unsetenv(engine::kernels::kCpuKernelsVariable);
      std::printf("%-22s %10.3f %10.3f %8.2f   (few rows from the codes: %.2fx the tiles)\n",
                  (std::string("  tiles ") + c10::toString(dtype)).c_str(), tiled * 1e3,
                  plain * 1e3, plain / tiled, tiled / quantized);
    }
    const at::Tensor xg = x.detach().requires_grad_();
    const double quantized_bw = BestSeconds(repeats, [&] {
      xg.mutable_grad().reset();
      engine::QuantizedMatmul(xg, weight).backward(dy);
    });
    const at::Tensor wg = w.detach();
    const double plain_bw = BestSeconds(repeats, [&] {
      xg.mutable_grad().reset();
      at::matmul(xg, wg.t()).backward(dy);
    });
    std::printf("%-22s %10.3f %10.3f %8.2f\n",
                (std::string("fwd+input grad ") + c10::toString(dtype)).c_str(), quantized_bw * 1e3,
                plain_bw * 1e3, plain_bw / quantized_bw);
  }

  std::printf("\n%-22s %10s %10s %8s %10s\n", "adamw step", "fused ms", "libtorch", "ratio",
              "GB/s");
  {
    at::Tensor master = at::randn({params});
    const at::Tensor grad = at::randn({params}).to(at::kBFloat16);
    at::Tensor m = at::zeros({params}), v = at::zeros({params});
    at::Tensor low = at::empty({params}, at::kBFloat16);
    engine::kernels::AdamWHyper hyper;
    const double fused = BestSeconds(repeats, [&] {
      ++hyper.step;
      engine::kernels::FusedAdamW(master, grad, m, v, hyper, 1.0, low);
    });
    at::Tensor p = master.clone();
    torch::optim::AdamW optimizer({p}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
    at::Tensor low_peer;
    const double peer = BestSeconds(repeats, [&] {
      p.mutable_grad() = grad.to(at::kFloat);
      optimizer.step();
      low_peer = p.to(at::kBFloat16);
    });
    // Bytes the fused pass must move: read p, m, v, g; write p, m, v, low.
    const double bytes = static_cast<double>(params) * (4 * 3 * 2 + 2 + 2);
    std::printf("%-22s %10.3f %10.3f %8.2f %10.2f\n", "f32 master, bf16 grad", fused * 1e3,
                peer * 1e3, peer / fused, bytes / fused / 1e9);

    // The engine's whole step for a bf16 weight with an f32 master (loss scale 1/1024): the fed
    // path (non-finite check, then one fused pass that unscales, updates and writes the bf16
    // weight) against the cast path it replaced (cast to f32, unscale, f32 sum for the check, the
    // fused update on f32, copy down).
    const double inverse_scale = 1.0 / 1024;
    const double fed = BestSeconds(repeats, [&] {
      ++hyper.step;
      if (engine::kernels::AllFinite(grad)) {
        engine::kernels::FusedAdamW(master, grad, m, v, hyper, inverse_scale, low);
      }
    });
    const double cast = BestSeconds(repeats, [&] {
      ++hyper.step;
      at::Tensor g32 = grad.to(at::kFloat);
      g32.mul_(inverse_scale);
      if (std::isfinite(g32.sum().item<double>())) {
        engine::kernels::FusedAdamW(master, g32, m, v, hyper);
        low.copy_(master);
      }
    });
    std::printf("%-22s %10.3f %10.3f %8.2f %10.2f   (cast path instead of LibTorch)\n",
                "engine step, scaled", fed * 1e3, cast * 1e3, cast / fed,
                (bytes + 2.0 * params) / fed / 1e9);
  }
  return 0;
}
