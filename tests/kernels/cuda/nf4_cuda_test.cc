// The CUDA NF4 dequantize against the CPU kernel, bit for bit (both compute codebook * f32 scale).
// Built only when nvcc is present and LibTorch has CUDA; skipped when no device is visible.
#include "engine_kernels/nf4_cuda.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "engine/torch_compat.h"
#include "engine_kernels/nf4.h"

namespace engine::kernels {
namespace {

at::Tensor DequantizeOnDevice(const Nf4Tensor& q, int64_t begin, int64_t end) {
  const at::Tensor packed = q.packed.to(at::kCUDA);
  const at::Tensor scales = Nf4BlockScales(q).to(at::kCUDA);
  at::Tensor out = at::empty({end - begin}, at::TensorOptions(at::kFloat).device(at::kCUDA));
  const int rc = cuda::DequantizeNf4F32(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(),
                                        q.block_size, begin, end, out.data_ptr<float>(), nullptr);
  EXPECT_EQ(rc, 0);
  return out.cpu();
}

TEST(Nf4CudaTest, MatchesTheCpuKernelOnEveryRange) {
  if (!compat::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(7);
  for (int64_t block : {32, 64, 256, 4096}) {
    for (bool double_quant : {false, true}) {
      const at::Tensor weight = at::randn({129, 257});
      const Nf4Tensor q = QuantizeNf4(weight, block, double_quant);
      const int64_t n = q.numel;
      for (auto [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
               {0, n}, {1, n}, {0, n - 1}, {3, 4}, {block - 1, 3 * block + 1}, {n - 1, n}}) {
        const at::Tensor cpu = DequantizeNf4Range(q, begin, end, at::kFloat);
        const at::Tensor gpu = DequantizeOnDevice(q, begin, end);
        ASSERT_TRUE(at::equal(cpu, gpu)) << "block " << block << " double_quant " << double_quant
                                         << " range [" << begin << ", " << end << ")";
      }
    }
  }
}

cuda::Nf4Output OutputOf(c10::ScalarType dtype) {
  return dtype == at::kFloat      ? cuda::Nf4Output::kFloat
         : dtype == at::kBFloat16 ? cuda::Nf4Output::kBFloat16
                                  : cuda::Nf4Output::kHalf;
}

// DequantizeNf4 straight into `dtype`, on the device.
at::Tensor DequantizeOnDeviceAs(const Nf4Tensor& q, int64_t begin, int64_t end,
                                c10::ScalarType dtype) {
  const at::Tensor packed = q.packed.to(at::kCUDA);
  const at::Tensor scales = Nf4BlockScales(q).to(at::kCUDA);
  at::Tensor out = at::empty({end - begin}, at::TensorOptions(dtype).device(at::kCUDA));
  const int rc =
      cuda::DequantizeNf4(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), q.block_size, begin,
                          end, out.data_ptr(), OutputOf(dtype), nullptr);
  EXPECT_EQ(rc, 0);
  return out.cpu();
}

TEST(Nf4CudaTest, DequantizeIntoEachDtypeMatchesTheCpuKernelOnEveryRange) {
  // Runs of 16 (from a start that is a multiple of 16) and single bytes (the rest) alike.
  if (!compat::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(9);
  for (int64_t block : {32, 64, 256, 4096}) {
    const Nf4Tensor q = QuantizeNf4(at::randn({129, 257}), block, /*double_quant=*/block >= 64);
    const int64_t n = q.numel;
    for (auto [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{0, n},
                                                                      {16, n},
                                                                      {1, n},
                                                                      {0, n - 1},
                                                                      {3, 4},
                                                                      {32, 32 + 16 * 5},
                                                                      {48, 48 + 16 * 5 + 3},
                                                                      {block - 1, 3 * block + 1},
                                                                      {n - 1, n}}) {
      for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
        const at::Tensor cpu = DequantizeNf4Range(q, begin, end, dtype);
        const at::Tensor gpu = DequantizeOnDeviceAs(q, begin, end, dtype);
        ASSERT_TRUE(at::equal(cpu, gpu))
            << "block " << block << " range [" << begin << ", " << end << ") " << dtype;
      }
    }
  }
}

TEST(Nf4CudaTest, FewRowsFromTheCodesEqualTheProductWithTheDequantizedWeight) {
  // f32 sums in another order than the reference's f64 ones: 1e-5 relative, 1e-4 absolute.
  if (!compat::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(10);
  const int64_t rows = 70, cols = 320;  // 70 rows: the last block of 8 warps is partly empty
  for (bool double_quant : {false, true}) {
    const Nf4Tensor q = QuantizeNf4(at::randn({rows, cols}), 64, double_quant);
    const at::Tensor packed = q.packed.to(at::kCUDA);
    const at::Tensor scales = Nf4BlockScales(q).to(at::kCUDA);
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const at::Tensor weight =
          DequantizeNf4Range(q, 0, q.numel, dtype).to(at::kDouble).view({rows, cols});
      for (int64_t n : {1, 3, 16}) {
        const at::Tensor x = at::randn({n, cols}).to(dtype).to(at::kFloat);
        const at::Tensor x_on_device = x.to(at::kCUDA).contiguous();
        at::Tensor y = at::empty({n, rows}, at::TensorOptions(at::kFloat).device(at::kCUDA));
        ASSERT_EQ(cuda::Nf4MatmulFewRows(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(),
                                         q.block_size, rows, cols, x_on_device.data_ptr<float>(), n,
                                         OutputOf(dtype), y.data_ptr<float>(), nullptr),
                  0);
        const at::Tensor expected = at::matmul(x.to(at::kDouble), weight.t()).to(at::kFloat);
        EXPECT_TRUE(at::allclose(y.cpu(), expected, 1e-5, 1e-4))
            << dtype << " n " << n << " double_quant " << double_quant;
      }
    }
    // More rows than it takes, or a width that is not whole runs of 16: refused, nothing launched.
    at::Tensor x = at::zeros({17, cols}, at::TensorOptions(at::kFloat).device(at::kCUDA));
    at::Tensor y = at::empty({17, rows}, at::TensorOptions(at::kFloat).device(at::kCUDA));
    EXPECT_NE(cuda::Nf4MatmulFewRows(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), 64, rows,
                                     cols, x.data_ptr<float>(), 17, cuda::Nf4Output::kFloat,
                                     y.data_ptr<float>(), nullptr),
              0);
    EXPECT_NE(cuda::Nf4MatmulFewRows(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), 64,
                                     rows * 2, cols / 2 - 8, x.data_ptr<float>(), 1,
                                     cuda::Nf4Output::kFloat, y.data_ptr<float>(), nullptr),
              0);
  }
}

// `q` with every tensor it holds on the GPU, as engine::Linear's are once the module moved there.
Nf4Tensor OnTheGpu(const Nf4Tensor& q) {
  Nf4Tensor on_gpu = q;
  for (at::Tensor* t : {&on_gpu.packed, &on_gpu.absmax, &on_gpu.absmax_codes, &on_gpu.absmax_scales,
                        &on_gpu.absmax_mean}) {
    if (t->defined()) *t = t->to(at::kCUDA);
  }
  return on_gpu;
}

TEST(Nf4CudaTest, DequantizeRangeRunsWhereTheCodesAre) {
  // What engine::Linear calls once the module was moved to the GPU.
  if (!compat::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(8);
  for (bool double_quant : {false, true}) {
    const Nf4Tensor q = QuantizeNf4(at::randn({65, 300}), 64, double_quant);
    const Nf4Tensor on_gpu = OnTheGpu(q);
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const at::Tensor gpu = DequantizeNf4Range(on_gpu, 300, 301 * 60 + 7, dtype);
      EXPECT_TRUE(gpu.is_cuda());
      EXPECT_TRUE(at::equal(gpu.cpu(), DequantizeNf4Range(q, 300, 301 * 60 + 7, dtype)))
          << dtype << " double_quant " << double_quant;
      EXPECT_TRUE(at::equal(DequantizeNf4RangeWithAten(on_gpu, 5, 999, dtype).cpu(),
                            DequantizeNf4Range(q, 5, 999, dtype)));
    }
  }
}

TEST(Nf4CudaTest, MatmulRowsRunWhereTheCodesAreAndEqualTheCpuKernel) {
  // What engine::Linear's few-rows path calls for codes on the GPU. f32 sums in another order than
  // the CPU kernel's: 1e-5; bf16 and f16 round y once more: one step of the output's mantissa.
  if (!compat::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(11);
  for (bool double_quant : {false, true}) {
    const Nf4Tensor q = QuantizeNf4(at::randn({70, 320}), 64, double_quant);
    const Nf4Tensor on_gpu = OnTheGpu(q);
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      // A row of x that starts one float into its storage: contiguous, not 16-byte aligned.
      const at::Tensor storage = at::randn({321});
      const at::Tensor x = storage.narrow(0, 1, 320).view({1, 320});
      const at::Tensor x_on_gpu = storage.to(at::kCUDA).narrow(0, 1, 320).view({1, 320});
      ASSERT_TRUE(Nf4MatmulRowsSupports(on_gpu, x_on_gpu, dtype)) << dtype;
      const at::Tensor gpu = Nf4MatmulRows(x_on_gpu, on_gpu, dtype);
      EXPECT_TRUE(gpu.is_cuda());
      EXPECT_EQ(gpu.scalar_type(), dtype);
      const at::Tensor weight = DequantizeNf4Range(q, 0, q.numel, dtype).to(at::kDouble);
      const at::Tensor expected =
          at::matmul(x.to(dtype).to(at::kDouble), weight.view({70, 320}).t()).to(dtype);
      const double tolerance = dtype == at::kFloat ? 1e-5 : dtype == at::kHalf ? 1e-3 : 1.0 / 128;
      EXPECT_TRUE(
          at::allclose(gpu.cpu().to(at::kFloat), expected.to(at::kFloat), tolerance, tolerance))
          << dtype << " double_quant " << double_quant;
    }
    // More rows than the kernel takes, or x on the CPU: not supported, so the tiles are used.
    EXPECT_FALSE(Nf4MatmulRowsSupports(on_gpu, at::zeros({17, 320}, at::kCUDA), at::kFloat));
    EXPECT_FALSE(Nf4MatmulRowsSupports(on_gpu, at::zeros({1, 320}), at::kFloat));
  }
}

TEST(Nf4CudaTest, RefusesABlockSizeThatIsNotAPowerOfTwo) {
  if (!compat::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  at::Tensor out = at::empty({4}, at::TensorOptions(at::kFloat).device(at::kCUDA));
  const at::Tensor packed = at::zeros({2}, at::TensorOptions(at::kByte).device(at::kCUDA));
  const at::Tensor scales = at::ones({1}, at::TensorOptions(at::kFloat).device(at::kCUDA));
  EXPECT_NE(cuda::DequantizeNf4F32(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), 100, 0, 4,
                                   out.data_ptr<float>(), nullptr),
            0);
}

}  // namespace
}  // namespace engine::kernels
