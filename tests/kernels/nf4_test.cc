// NF4 kernels: the codebook and packing bitsandbytes uses, nearest-code rounding, error bounds, and
// the double-quantized scales.
#include "engine_kernels/nf4.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace engine::kernels {
namespace {

TEST(Nf4Test, CodebookIsBitsandbytesNormalFloat) {
  // bitsandbytes/functional.py get_4bit_type("nf4"), to the digits printed there.
  const float expected[16] = {-1.0f,       -0.6961928f, -0.5250731f, -0.3949175f,
                              -0.2844414f, -0.1847734f, -0.0910500f, 0.0f,
                              0.0795803f,  0.1609302f,  0.2461123f,  0.3379152f,
                              0.4407098f,  0.5626170f,  0.7229568f,  1.0f};
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(kNf4Codebook[i], expected[i], 1e-6) << i;
  EXPECT_EQ(kNf4Codebook[7], 0.0f);
}

TEST(Nf4Test, FirstElementGoesInTheHighNibble) {
  // Block of 32 with absmax 1: values equal to codes 0, 15, 7, 8, ... pack as 0x0F, 0x78, ...
  at::Tensor w = at::zeros({32});
  w[0] = -1.0f;
  w[1] = 1.0f;
  w[2] = 0.0f;
  w[3] = kNf4Codebook[8];
  const Nf4Tensor q = QuantizeNf4(w, 32, /*double_quant=*/false);
  ASSERT_EQ(q.packed.numel(), 16);
  EXPECT_EQ(q.packed[0].item<uint8_t>(), 0x0F);
  EXPECT_EQ(q.packed[1].item<uint8_t>(), 0x78);
  EXPECT_EQ(q.packed[2].item<uint8_t>(), 0x77);  // zeros are code 7
  EXPECT_FLOAT_EQ(q.absmax[0].item<float>(), 1.0f);
  EXPECT_TRUE(at::equal(DequantizeNf4(q, at::kFloat), w));
}

TEST(Nf4Test, OddLengthPadsTheLastByte) {
  const at::Tensor w = at::tensor({1.0f, -1.0f, 1.0f});
  const Nf4Tensor q = QuantizeNf4(w, 32, false);
  ASSERT_EQ(q.packed.numel(), 2);
  EXPECT_EQ(q.packed[1].item<uint8_t>(), 0xF0);
  EXPECT_TRUE(at::equal(DequantizeNf4(q, at::kFloat), w));
}

TEST(Nf4Test, CodesAreTheNearestCodebookValues) {
  at::manual_seed(1);
  const at::Tensor x = at::rand({5000}) * 2 - 1;
  const at::Tensor codebook =
      at::tensor(std::vector<float>(kNf4Codebook.begin(), kNf4Codebook.end()));
  const at::Tensor brute = (x.unsqueeze(1) - codebook.unsqueeze(0)).abs().argmin(1);
  EXPECT_TRUE(at::equal(Nf4NearestCodes(x).to(at::kLong), brute));
}

TEST(Nf4Test, ErrorOnNormalDataIsBoundedPerBlock) {
  at::manual_seed(2);
  const at::Tensor w = at::randn({256, 384});
  for (int64_t block : {32, 64, 256, 4096}) {
    const Nf4Tensor q = QuantizeNf4(w, block, false);
    const at::Tensor error = (DequantizeNf4(q, at::kFloat) - w).abs().reshape({-1, block});
    // No value is further from its code than half the widest gap (between -1 and the next code).
    const float half_gap = 0.5f * (kNf4Codebook[1] - kNf4Codebook[0]);
    const at::Tensor bound = q.absmax.unsqueeze(1) * half_gap + 1e-6f;
    EXPECT_TRUE((error <= bound).all().item<bool>()) << "block " << block;
    // And on normal data the typical error is small: about a tenth of the standard deviation.
    EXPECT_LT(error.mean().item<float>(), 0.1f) << "block " << block;
  }
}

TEST(Nf4Test, DoubleQuantizedScalesStayWithinHalfAStepOfTheDynamicMap) {
  at::manual_seed(3);
  const at::Tensor w = at::randn({512, 512}) * 0.02;
  const Nf4Tensor plain = QuantizeNf4(w, 64, false);
  const Nf4Tensor dq = QuantizeNf4(w, 64, true);
  ASSERT_TRUE(dq.double_quantized());
  EXPECT_EQ(dq.absmax_codes.numel(), 4096);
  EXPECT_EQ(dq.absmax_scales.numel(), 16);
  // Same 4-bit codes; scales decoded within half the dynamic map's widest gap (0.0141, between
  // its values near 1) of their group's largest deviation from the mean.
  EXPECT_TRUE(at::equal(plain.packed, dq.packed));
  const at::Tensor& map = Nf4ScaleMap();
  ASSERT_EQ(map.numel(), 256);
  EXPECT_FLOAT_EQ(map[0].item<float>(), -0.99296875f);
  EXPECT_FLOAT_EQ(map[255].item<float>(), 1.0f);
  const double half_gap = (map.narrow(0, 1, 255) - map.narrow(0, 0, 255)).max().item<double>() / 2;
  EXPECT_NEAR(half_gap, 0.00703, 1e-4);
  const at::Tensor largest =
      dq.absmax_scales.repeat_interleave(kNf4DoubleQuantBlock).narrow(0, 0, 4096);
  const at::Tensor error = (Nf4BlockScales(dq) - plain.absmax).abs();
  EXPECT_TRUE((error <= largest * half_gap + 1e-7f).all().item<bool>());
  // The codes are the nearest map values: no other code decodes closer.
  const at::Tensor centred = (plain.absmax - dq.absmax_mean) / largest.clamp_min(1e-38f);
  const at::Tensor chosen = map.index_select(0, dq.absmax_codes.to(at::kLong));
  const at::Tensor best = std::get<0>((centred.unsqueeze(1) - map.unsqueeze(0)).abs().min(1));
  EXPECT_TRUE(((chosen - centred).abs() <= best + 1e-6f).all().item<bool>());
  // 4 bits + 8 / 64 + 32 / (64 * 256) + the mean: 4.127 bits per weight, under QLoRA's 4.2.
  const double bits = 8.0 * dq.storage_bytes() / w.numel();
  EXPECT_LT(bits, 4.2);
  EXPECT_GT(bits, 4.12);
  EXPECT_NEAR(8.0 * plain.storage_bytes() / w.numel(), 4.5, 1e-9);
}

TEST(Nf4Test, RangesMatchTheWholeTensorInEveryDtype) {
  at::manual_seed(4);
  const at::Tensor w = at::randn({7, 45});
  const Nf4Tensor q = QuantizeNf4(w, 32, true);
  const at::Tensor whole = DequantizeNf4(q, at::kFloat).reshape({-1});
  for (auto [begin, end] :
       {std::pair<int64_t, int64_t>{0, 315}, {1, 2}, {3, 100}, {64, 65}, {33, 314}, {10, 10}}) {
    EXPECT_TRUE(
        at::equal(DequantizeNf4Range(q, begin, end, at::kFloat), whole.slice(0, begin, end)))
        << begin << ".." << end;
  }
  EXPECT_TRUE(at::equal(DequantizeNf4(q, at::kBFloat16), whole.view({7, 45}).to(at::kBFloat16)));
  EXPECT_TRUE(
      at::allclose(DequantizeNf4(q, at::kHalf).to(at::kFloat), whole.view({7, 45}), 1e-3, 1e-3));
  // bf16 input quantizes like its f32 value.
  EXPECT_TRUE(at::equal(QuantizeNf4(w.to(at::kBFloat16), 32, false).packed,
                        QuantizeNf4(w.to(at::kBFloat16).to(at::kFloat), 32, false).packed));
}

TEST(Nf4Test, ThePortableAtenPathMatchesTheKernel) {
  // What runs on a device without an NF4 kernel of its own.
  at::manual_seed(6);
  const at::Tensor w = at::randn({9, 77});
  for (bool double_quant : {false, true}) {
    const Nf4Tensor q = QuantizeNf4(w, 32, double_quant);
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 693},
                              {1, 2},
                              {31, 97},
                              {64, 693},
                              {5, 6},
                              {692, 693},
                              {7, 7}}) {
      EXPECT_TRUE(at::equal(DequantizeNf4RangeWithAten(q, begin, end, at::kFloat),
                            DequantizeNf4Range(q, begin, end, at::kFloat)))
          << begin << ".." << end << " double_quant " << double_quant;
    }
    EXPECT_TRUE(at::equal(DequantizeNf4RangeWithAten(q, 0, 693, at::kBFloat16),
                          DequantizeNf4Range(q, 0, 693, at::kBFloat16)));
  }
}

// The CPU kernel with its AVX-512 path allowed (where the CPU has one) and without it.
class Nf4CpuPathTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { SetNf4CpuAvx512Allowed(GetParam()); }
  void TearDown() override { SetNf4CpuAvx512Allowed(true); }
};

INSTANTIATE_TEST_SUITE_P(Avx512AllowedOrNot, Nf4CpuPathTest, ::testing::Bool());

TEST_P(Nf4CpuPathTest, EveryOutputDtypeMatchesTheAtenPathBitForBit) {
  // Long enough ranges for the vectorised paths (8 f32 / 32 bf16 or f16 elements per step), with
  // odd starts and ends and ranges inside one block; 32-element blocks are one step each.
  at::manual_seed(8);
  const at::Tensor w = at::randn({301, 257});
  const int64_t n = w.numel();
  for (int64_t block : {32, 64, 4096}) {
    const Nf4Tensor q = QuantizeNf4(w, block, /*double_quant=*/true);
    for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, n},
                                {1, n - 1},
                                {63, 64 * 40 + 7},
                                {4096 * 3 + 5, 4096 * 3 + 70},
                                {n - 33, n}}) {
        EXPECT_TRUE(at::equal(DequantizeNf4Range(q, begin, end, dtype),
                              DequantizeNf4RangeWithAten(q, begin, end, dtype)))
            << "block " << block << " " << dtype << " [" << begin << ", " << end << ")";
      }
    }
  }
}

TEST_P(Nf4CpuPathTest, DenormalAndNonFiniteScalesRoundAsTheAtenPath) {
  // Blocks whose products are denormal (bf16 keeps them; a conversion that flushes them would
  // not), infinite (a code of 0 times inf is NaN) and NaN.
  at::Tensor w = at::randn({4, 128}) * 1e-39;
  w[1][5] = std::numeric_limits<float>::infinity();
  w[2][70] = -std::numeric_limits<float>::infinity();
  w[3][3] = std::numeric_limits<float>::quiet_NaN();
  const Nf4Tensor q = QuantizeNf4(w, 64, /*double_quant=*/false);
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::Tensor kernel = DequantizeNf4Range(q, 0, w.numel(), dtype);
    const at::Tensor aten = DequantizeNf4RangeWithAten(q, 0, w.numel(), dtype);
    // NaN where ATen has NaN (ATen's vectorised conversions choose other NaN bits than c10's
    // scalar ones), and bit for bit elsewhere, compared as integers of the element's width.
    const at::Tensor nan = aten.isnan();
    EXPECT_TRUE(at::equal(kernel.isnan(), nan)) << dtype;
    EXPECT_GT(nan.sum().item<int64_t>(), 64) << dtype;
    const c10::ScalarType bits = dtype == at::kFloat ? at::kInt : at::kShort;
    EXPECT_TRUE(
        at::equal(kernel.view(bits).masked_fill(nan, 0), aten.view(bits).masked_fill(nan, 0)))
        << dtype;
    if (dtype != at::kHalf) {  // f16 has no values this small
      EXPECT_GT(kernel.slice(0, 0, 64).ne(0).sum().item<int64_t>(), 32) << dtype << ": flushed";
    }
  }
}

TEST(Nf4Test, RefusesBadBlockSizesAndDtypes) {
  for (int64_t bad : {0, 16, 48, 100, 8192}) {
    EXPECT_FALSE(IsValidNf4BlockSize(bad)) << bad;
    try {
      QuantizeNf4(at::zeros({64}), bad, false);
      ADD_FAILURE() << bad;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("power of two from 32 to 4096"), std::string::npos);
    }
  }
  EXPECT_THROW(QuantizeNf4(at::zeros({64}, at::kLong), 64, false), c10::Error);
}

// The few-rows matmul computes what a GEMM on the dequantized weight computes: W exactly as
// DequantizeNf4 gives it, x rounded to the compute dtype, f32 sums (here against an f64
// reference), the result rounded to the compute dtype.
TEST(Nf4Test, FewRowsMatmulEqualsTheProductWithTheDequantizedWeight) {
  at::manual_seed(8);
  for (const bool double_quant : {false, true}) {
    for (const int64_t block : {32, 64, 128}) {
      const at::Tensor weight = at::randn({40, 256});
      const Nf4Tensor q = QuantizeNf4(weight, block, double_quant);
      for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        for (const int64_t n : {1, 3, 8, 11}) {  // one group of x rows, several, and a remainder
          const at::Tensor x = at::randn({n, 256});
          ASSERT_TRUE(Nf4MatmulRowsSupports(q, x, dtype));
          const at::Tensor got = Nf4MatmulRows(x, q, dtype);
          ASSERT_EQ(got.scalar_type(), dtype);
          ASSERT_EQ(got.sizes(), (std::vector<int64_t>{n, 40}));
          const at::Tensor want =
              at::matmul(x.to(dtype).to(at::kDouble), DequantizeNf4(q, dtype).to(at::kDouble).t());
          // f32 sums of 256 products of O(1): 1e-4 absolute; bf16: one rounding of the result.
          const double tolerance = dtype == at::kFloat ? 1e-4 : 1.0 / 128;
          const at::Tensor error = (got.to(at::kDouble) - want).abs() /
                                   (dtype == at::kFloat ? at::ones_like(want) : want.abs() + 1);
          EXPECT_LE(error.max().item<double>(), tolerance)
              << "block " << block << " double_quant " << double_quant << " " << dtype << " n "
              << n;
        }
      }
    }
  }
}

// One-hot rows of x pick columns of W: every decoded weight, bit for bit, in both dtypes.
TEST(Nf4Test, FewRowsMatmulDecodesEveryWeightAsDequantizeDoes) {
  at::manual_seed(9);
  const Nf4Tensor q = QuantizeNf4(at::randn({24, 128}) * 3, 64, /*double_quant=*/true);
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor dense = DequantizeNf4(q, dtype);
    for (int64_t first = 0; first < 128; first += 8) {
      const at::Tensor x = at::eye(128).narrow(0, first, 8);  // 8 rows: columns first..first+7
      EXPECT_TRUE(at::equal(Nf4MatmulRows(x, q, dtype), dense.narrow(1, first, 8).t()))
          << dtype << " columns from " << first;
    }
  }
}

TEST(Nf4Test, FewRowsMatmulRefusesWhatItDoesNotTake) {
  const Nf4Tensor q = QuantizeNf4(at::randn({8, 128}), 64, true);
  EXPECT_FALSE(Nf4MatmulRowsSupports(q, at::randn({2, 128}), at::kHalf));
  EXPECT_FALSE(Nf4MatmulRowsSupports(q, at::randn({2, 64}), at::kFloat));
  EXPECT_FALSE(Nf4MatmulRowsSupports(q, at::randn({2, 2, 128}), at::kFloat));
  const Nf4Tensor flat = QuantizeNf4(at::randn({96}), 32, false);  // not 2-D
  EXPECT_FALSE(Nf4MatmulRowsSupports(flat, at::randn({1, 96}), at::kFloat));
  const Nf4Tensor ragged = QuantizeNf4(at::randn({4, 96}), 64, false);  // rows split blocks
  EXPECT_FALSE(Nf4MatmulRowsSupports(ragged, at::randn({1, 96}), at::kFloat));
  EXPECT_THROW(Nf4MatmulRows(at::randn({2, 64}), q, at::kFloat), c10::Error);
}

}  // namespace
}  // namespace engine::kernels
