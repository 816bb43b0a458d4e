#include "engine_kernels/nf4.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#if defined(ENGINE_KERNELS_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "engine_kernels/nf4_cuda.h"
#endif
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>

#define ENGINE_SIMD_CLONES __attribute__((target_clones("avx2", "default")))

namespace engine::kernels {

const std::array<float, 16> kNf4Codebook = {-1.0f,
                                            -0.6961928009986877f,
                                            -0.5250730514526367f,
                                            -0.39491748809814453f,
                                            -0.28444138169288635f,
                                            -0.18477343022823334f,
                                            -0.09105003625154495f,
                                            0.0f,
                                            0.07958029955625534f,
                                            0.16093020141124725f,
                                            0.24611230194568634f,
                                            0.33791524171829224f,
                                            0.44070982933044434f,
                                            0.5626170039176941f,
                                            0.7229568362236023f,
                                            1.0f};

namespace {

// Midpoints between neighbouring codes: a value's code is the number of midpoints below it.
struct Midpoints {
  float value[15];
  Midpoints() {
    for (int i = 0; i < 15; ++i) value[i] = 0.5f * (kNf4Codebook[i] + kNf4Codebook[i + 1]);
  }
};
const Midpoints& Mids() {
  static const Midpoints mids;
  return mids;
}

ENGINE_SIMD_CLONES
inline uint8_t NearestCode(float x, const float* mids) {
  uint8_t code = 0;
  for (int i = 0; i < 15; ++i) code += x > mids[i] ? 1 : 0;
  return code;
}

// Codes of elements [begin, end) of `w` scaled by 1/scale, written as nibbles into `packed`.
template <typename T>
ENGINE_SIMD_CLONES void QuantizeBlock(const T* w, int64_t begin, int64_t end, float inverse,
                                      uint8_t* packed) {
  const float* mids = Mids().value;
  for (int64_t i = begin; i < end; ++i) {
    const uint8_t code = NearestCode(static_cast<float>(w[i]) * inverse, mids);
    uint8_t& byte = packed[i / 2];
    // Blocks start at even offsets (block sizes are even), so no two threads share a byte.
    byte = (i % 2 == 0) ? static_cast<uint8_t>((code << 4) | (byte & 0x0f))
                        : static_cast<uint8_t>((byte & 0xf0) | code);
  }
}

// Both values of each possible byte, high nibble first.
struct PairTable {
  float value[256][2];
  PairTable() {
    for (int b = 0; b < 256; ++b) {
      value[b][0] = kNf4Codebook[b >> 4];
      value[b][1] = kNf4Codebook[b & 15];
    }
  }
};
const PairTable& Pairs() {
  static const PairTable table;
  return table;
}

template <typename T>
ENGINE_SIMD_CLONES void DequantizeSpan(const uint8_t* packed, int64_t begin, int64_t end,
                                       float scale, T* out) {
  const auto& pairs = Pairs().value;
  int64_t i = begin;
  if (i < end && i % 2 == 1) {
    *out++ = static_cast<T>(kNf4Codebook[packed[i / 2] & 15] * scale);
    ++i;
  }
  for (; i + 1 < end; i += 2) {
    const float* pair = pairs[packed[i / 2]];
    out[0] = static_cast<T>(pair[0] * scale);
    out[1] = static_cast<T>(pair[1] * scale);
    out += 2;
  }
  if (i < end) *out = static_cast<T>(kNf4Codebook[packed[i / 2] >> 4] * scale);
}

// `scales` holds the scales of the blocks [begin / block, (end - 1) / block] only.
template <typename T>
void DequantizeRangeTyped(const uint8_t* packed, const float* scales, int64_t block, int64_t begin,
                          int64_t end, T* out) {
  const int64_t first = begin / block, last = (end - 1) / block;
  at::parallel_for(first, last + 1, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = std::max(begin, b * block), hi = std::min(end, (b + 1) * block);
      DequantizeSpan(packed, lo, hi, scales[b - first], out + (lo - begin));
    }
  });
}

}  // namespace

int64_t Nf4Tensor::storage_bytes() const {
  int64_t bytes = packed.nbytes();
  for (const at::Tensor* t : {&absmax, &absmax_codes, &absmax_scales, &absmax_mean}) {
    if (t->defined()) bytes += t->nbytes();
  }
  return bytes;
}

bool IsValidNf4BlockSize(int64_t block_size) {
  return block_size >= 32 && block_size <= 4096 && (block_size & (block_size - 1)) == 0;
}

at::Tensor Nf4NearestCodes(const at::Tensor& normalized) {
  const at::Tensor x = normalized.to(at::kFloat).contiguous();
  at::Tensor codes = at::empty(x.sizes(), x.options().dtype(at::kByte));
  const float* in = x.data_ptr<float>();
  uint8_t* out = codes.data_ptr<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) out[i] = NearestCode(in[i], Mids().value);
  return codes;
}

Nf4Tensor QuantizeNf4(const at::Tensor& weight, int64_t block_size, bool double_quant) {
  TORCH_CHECK(IsValidNf4BlockSize(block_size), "NF4 block size ", block_size,
              " is not a power of two from 32 to 4096");
  TORCH_CHECK(weight.device().is_cpu(), "QuantizeNf4 takes a CPU tensor, got one on ",
              weight.device());
  const auto dtype = weight.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "NF4 quantizes f32, bf16 or f16 tensors, not ", dtype);
  const at::Tensor w = weight.contiguous();
  Nf4Tensor q;
  q.shape = w.sizes().vec();
  q.numel = w.numel();
  q.block_size = block_size;
  const int64_t blocks = q.blocks();
  q.packed = at::zeros({(q.numel + 1) / 2}, at::kByte);
  at::Tensor absmax = blocks > 0 ? at::constant_pad_nd(w.reshape({-1}).to(at::kFloat).abs(),
                                                       {0, blocks * block_size - q.numel}, 0)
                                       .view({blocks, block_size})
                                       .amax(1)
                                 : at::zeros({0}, at::kFloat);
  const float* scales = absmax.data_ptr<float>();
  uint8_t* packed = q.packed.data_ptr<uint8_t>();
  const int64_t numel = q.numel;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "QuantizeNf4", [&] {
    const scalar_t* data = w.data_ptr<scalar_t>();
    at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const float inverse = scales[b] > 0 ? 1.0f / scales[b] : 0.0f;
        QuantizeBlock(data, b * block_size, std::min(numel, (b + 1) * block_size), inverse, packed);
      }
    });
  });
  if (!double_quant) {
    q.absmax = absmax;
    return q;
  }
  const float mean = blocks > 0 ? absmax.mean().item<float>() : 0.0f;
  q.absmax_mean = at::full({1}, mean, at::kFloat);
  const int64_t groups = (blocks + kNf4DoubleQuantBlock - 1) / kNf4DoubleQuantBlock;
  const at::Tensor centered =
      at::constant_pad_nd(absmax - mean, {0, groups * kNf4DoubleQuantBlock - blocks}, 0)
          .view({groups, kNf4DoubleQuantBlock});
  q.absmax_scales = centered.abs().amax(1) / 127.0f;
  const at::Tensor safe =
      at::where(q.absmax_scales > 0, q.absmax_scales, at::ones_like(q.absmax_scales));
  q.absmax_codes = (centered / safe.unsqueeze(1))
                       .round()
                       .clamp(-127, 127)
                       .add(128)
                       .to(at::kByte)
                       .reshape({-1})
                       .narrow(0, 0, blocks)
                       .contiguous();
  return q;
}

at::Tensor Nf4BlockScales(const Nf4Tensor& q) { return Nf4BlockScales(q, 0, q.blocks()); }

at::Tensor Nf4BlockScales(const Nf4Tensor& q, int64_t first, int64_t end) {
  if (!q.double_quantized()) return q.absmax.narrow(0, first, end - first);
  const at::Tensor group =
      at::arange(first, end, at::TensorOptions(at::kLong).device(q.absmax_codes.device()))
          .div_(kNf4DoubleQuantBlock, "floor");
  return (q.absmax_codes.narrow(0, first, end - first).to(at::kFloat) - 128.0f) *
             q.absmax_scales.index_select(0, group).to(at::kFloat) +
         q.absmax_mean.to(at::kFloat);
}

at::Tensor DequantizeNf4Range(const Nf4Tensor& q, int64_t begin, int64_t end,
                              c10::ScalarType dtype) {
  TORCH_CHECK(0 <= begin && begin <= end && end <= q.numel, "NF4 range [", begin, ", ", end,
              ") is outside the tensor's ", q.numel, " elements");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "NF4 dequantizes to f32, bf16 or f16, not ", dtype);
  if (!q.packed.device().is_cpu()) return DequantizeNf4RangeOffCpu(q, begin, end, dtype);
  at::Tensor out = at::empty({end - begin}, at::TensorOptions().dtype(dtype));
  if (begin == end) return out;
  // Only the blocks the range touches are decoded: the quantized matmul asks for one row tile at a
  // time. A precision policy may have cast the stored scales; they are read as f32.
  const int64_t first = begin / q.block_size;
  const at::Tensor scales =
      Nf4BlockScales(q, first, (end - 1) / q.block_size + 1).to(at::kFloat).contiguous();
  const uint8_t* packed = q.packed.data_ptr<uint8_t>();
  const float* s = scales.data_ptr<float>();
  if (dtype == at::kFloat) {
    DequantizeRangeTyped(packed, s, q.block_size, begin, end, out.data_ptr<float>());
  } else if (dtype == at::kBFloat16) {
    DequantizeRangeTyped(packed, s, q.block_size, begin, end, out.data_ptr<c10::BFloat16>());
  } else {
    DequantizeRangeTyped(packed, s, q.block_size, begin, end, out.data_ptr<c10::Half>());
  }
  return out;
}

at::Tensor DequantizeNf4RangeWithAten(const Nf4Tensor& q, int64_t begin, int64_t end,
                                      c10::ScalarType dtype) {
  const auto device = q.packed.device();
  if (begin == end) return at::empty({0}, at::TensorOptions(dtype).device(device));
  const int64_t first = begin / q.block_size;
  const at::Tensor scales =
      Nf4BlockScales(q, first, (end - 1) / q.block_size + 1).to(at::kFloat).contiguous();
  const int64_t first_byte = begin / 2;
  const at::Tensor bytes = q.packed.narrow(0, first_byte, (end + 1) / 2 - first_byte).to(at::kLong);
  const at::Tensor codes = at::stack({bytes.div(16, "floor"), bytes.remainder(16)}, 1)
                               .reshape({-1})
                               .narrow(0, begin - 2 * first_byte, end - begin);
  const at::Tensor codebook =
      at::tensor(c10::ArrayRef<float>(kNf4Codebook.data(), kNf4Codebook.size())).to(device);
  const at::Tensor element_scales =
      scales.repeat_interleave(q.block_size).narrow(0, begin - first * q.block_size, end - begin);
  return (codebook.index_select(0, codes) * element_scales).to(dtype);
}

at::Tensor DequantizeNf4RangeOffCpu(const Nf4Tensor& q, int64_t begin, int64_t end,
                                    c10::ScalarType dtype) {
#if defined(ENGINE_KERNELS_WITH_CUDA)
  if (q.packed.is_cuda() && begin < end) {
    const c10::cuda::CUDAGuard guard(q.packed.device());
    const int64_t first = begin / q.block_size;
    const at::Tensor scales =
        Nf4BlockScales(q, first, (end - 1) / q.block_size + 1).to(at::kFloat).contiguous();
    at::Tensor out = at::empty({end - begin}, q.packed.options().dtype(at::kFloat));
    // The kernel indexes scales by absolute block; these start at block `first`.
    const int rc = cuda::DequantizeNf4F32(
        q.packed.data_ptr<uint8_t>(), scales.data_ptr<float>() - first, q.block_size, begin, end,
        out.data_ptr<float>(), at::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(rc == 0, "NF4 CUDA dequantize failed to launch (cudaError ", rc, ")");
    return dtype == at::kFloat ? out : out.to(dtype);
  }
#endif
  return DequantizeNf4RangeWithAten(q, begin, end, dtype);
}

at::Tensor DequantizeNf4(const Nf4Tensor& q, c10::ScalarType dtype) {
  return DequantizeNf4Range(q, 0, q.numel, dtype).view(q.shape);
}

}  // namespace engine::kernels
