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
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu_kernel_support.h"

#define ENGINE_SIMD_CLONES __attribute__((target_clones("avx2", "default")))

namespace engine::kernels {

namespace {

std::atomic<bool> nf4_avx512_allowed{true};

[[maybe_unused]] bool Nf4Avx512Allowed() {
  return nf4_avx512_allowed.load(std::memory_order_relaxed);
}

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

// The f32 scale of each CPU block, decoded as AtenBlockScales decodes it (the code's map value
// times its group's scale, then the mean added: two f32 roundings) but one block at a time, so
// that a kernel decodes the scales of its own rows instead of a pass of ATen operations over all
// of them. A precision policy may have cast the stored scales; they are read as f32.
class BlockScaleReader {
 public:
  explicit BlockScaleReader(const Nf4Tensor& q) {
    if (!q.double_quantized()) {
      absmax_ = q.absmax.to(at::kFloat).contiguous();
      return;
    }
    nested_ = q.absmax_scales.to(at::kFloat).contiguous();
    codes_ = q.absmax_codes.contiguous();
    // A host tensor of one value, read in place.
    mean_ = *q.absmax_mean.to(at::kFloat).contiguous().data_ptr<float>();
  }

  void Read(int64_t first, int64_t count, float* out) const {
    if (absmax_.defined()) {
      const float* absmax = absmax_.data_ptr<float>();
      std::copy(absmax + first, absmax + first + count, out);
      return;
    }
    const float* map = Nf4ScaleMap().data_ptr<float>();
    const float* nested = nested_.data_ptr<float>();
    const uint8_t* codes = codes_.data_ptr<uint8_t>();
    for (int64_t b = first; b < first + count; ++b) {
      const float product = map[codes[b]] * nested[b / kNf4DoubleQuantBlock];
      *out++ = product + mean_;
    }
  }

 private:
  at::Tensor absmax_;  // not double-quantized
  at::Tensor nested_, codes_;
  float mean_ = 0;
};

#if defined(__x86_64__)
#include "nf4_dequantize_x86.inc"

// Rounded to the nearest bf16, ties to even (as Bf16Tables rounds), still as f32.
inline __attribute__((target("avx2"))) __m256 RoundToBf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
  return _mm256_castsi256_ps(_mm256_and_si256(rounded, _mm256_set1_epi32(-65536)));
}

// y[k * rows + r] = x_k . W_r for rows r of [begin, end) (`scales` from row `begin` on) and the M
// rows of x from `x` on (f32, `cols` apart): each group of 8 weights decoded once, in registers,
// and multiplied into all M rows; f32 products and sums, in an order fixed by `cols` alone.
template <bool kBf16, int M>
__attribute__((target("avx2,fma"))) void FewRowsTile(const uint8_t* packed, const float* scales,
                                                     int64_t block, int64_t cols, const float* x,
                                                     int64_t rows, int64_t begin, int64_t end,
                                                     float* y) {
  const __m256 codebook_low = _mm256_loadu_ps(kNf4Codebook.data());
  const __m256 codebook_high = _mm256_loadu_ps(kNf4Codebook.data() + 8);
  const int64_t blocks_per_row = cols / block;
  for (int64_t r = begin; r < end; ++r) {
    const uint8_t* row = packed + r * cols / 2;
    const float* row_scales = scales + (r - begin) * blocks_per_row;
    __m256 acc[M];
    for (int k = 0; k < M; ++k) acc[k] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks_per_row; ++b) {
      // The block's 16 weight values, as DequantizeAligned8 / Bf16Tables make them.
      const __m256 scale = _mm256_set1_ps(row_scales[b]);
      __m256 table_low = _mm256_mul_ps(codebook_low, scale);
      __m256 table_high = _mm256_mul_ps(codebook_high, scale);
      if constexpr (kBf16) {
        table_low = RoundToBf16(table_low);
        table_high = RoundToBf16(table_high);
      }
      for (int64_t c = b * block; c < (b + 1) * block; c += 8) {
        const __m256 w = Lookup8(row + c / 2, table_low, table_high);
        for (int k = 0; k < M; ++k) {
          acc[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + k * cols + c), acc[k]);
        }
      }
    }
    for (int k = 0; k < M; ++k) {
      float lanes[8];
      _mm256_storeu_ps(lanes, acc[k]);
      y[k * rows + r] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                        ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    }
  }
}

// y [n, rows] (f32) = x [n, cols] @ W^T, in groups of up to 8 rows of x, rows of W in parallel.
template <bool kBf16>
void MatmulRowsTyped(const Nf4Tensor& q, const BlockScaleReader& scales, const float* x, int64_t n,
                     float* y) {
  const int64_t rows = q.shape[0], cols = q.shape[1], block = q.block_size;
  const int64_t blocks_per_row = cols / block;
  const uint8_t* packed = q.packed.data_ptr<uint8_t>();
  using Tile = void (*)(const uint8_t*, const float*, int64_t, int64_t, const float*, int64_t,
                        int64_t, int64_t, float*);
  static constexpr Tile kTiles[8] = {
      FewRowsTile<kBf16, 1>, FewRowsTile<kBf16, 2>, FewRowsTile<kBf16, 3>, FewRowsTile<kBf16, 4>,
      FewRowsTile<kBf16, 5>, FewRowsTile<kBf16, 6>, FewRowsTile<kBf16, 7>, FewRowsTile<kBf16, 8>};
  at::parallel_for(0, rows, GrainFor(cols * (n + 1)), [&](int64_t begin, int64_t end) {
    std::vector<float> task_scales(static_cast<size_t>((end - begin) * blocks_per_row));
    scales.Read(begin * blocks_per_row, (end - begin) * blocks_per_row, task_scales.data());
    for (int64_t first = 0; first < n; first += 8) {
      const int64_t m = std::min<int64_t>(8, n - first);
      kTiles[m - 1](packed, task_scales.data(), block, cols, x + first * cols, rows, begin, end,
                    y + first * rows);
    }
  });
}
#else
template <typename T>
int64_t DequantizeVectorised(const uint8_t*, int64_t, float, T*) {
  return 0;
}

template <typename T>
void DequantizeWholeBlocks(const uint8_t*, const float*, int64_t, int64_t, T*) {}

bool WholeBlocksVectorised() { return false; }

template <bool kBf16>
void MatmulRowsTyped(const Nf4Tensor&, const BlockScaleReader&, const float*, int64_t, float*) {}
#endif

template <typename T>
ENGINE_SIMD_CLONES void DequantizeSpan(const uint8_t* packed, int64_t begin, int64_t end,
                                       float scale, T* out) {
  const auto& pairs = Pairs().value;
  int64_t i = begin;
  if (i < end && i % 2 == 1) {
    *out++ = static_cast<T>(kNf4Codebook[packed[i / 2] & 15] * scale);
    ++i;
  }
  const int64_t vectorised = DequantizeVectorised(packed + i / 2, end - i, scale, out);
  i += vectorised;
  out += vectorised;
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
  const bool vectorised = WholeBlocksVectorised();
  at::parallel_for(first, last + 1, GrainFor(block), [&](int64_t b0, int64_t b1) {
    int64_t b = b0;
    while (b < b1) {
      const int64_t lo = std::max(begin, b * block), hi = std::min(end, (b + 1) * block);
      if (vectorised && lo == b * block && hi == lo + block) {
        // The run of whole blocks from b on; only the range's first and last can be partial.
        int64_t run_end = b + 1;
        while (run_end < b1 && (run_end + 1) * block <= end) ++run_end;
        DequantizeWholeBlocks(packed + lo / 2, scales + (b - first), block, run_end - b,
                              out + (lo - begin));
        b = run_end;
        continue;
      }
      DequantizeSpan(packed, lo, hi, scales[b - first], out + (lo - begin));
      ++b;
    }
  });
}

}  // namespace

void SetNf4CpuAvx512Allowed(bool allowed) {
  nf4_avx512_allowed.store(allowed, std::memory_order_relaxed);
}

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
    at::parallel_for(0, blocks, GrainFor(block_size), [&](int64_t b0, int64_t b1) {
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
  // The padding of the last group is zero, so it changes no group's largest magnitude.
  const at::Tensor centered =
      at::constant_pad_nd(absmax - mean, {0, groups * kNf4DoubleQuantBlock - blocks}, 0)
          .view({groups, kNf4DoubleQuantBlock});
  q.absmax_scales = centered.abs().amax(1).contiguous();
  const at::Tensor& map = Nf4ScaleMap();
  const at::Tensor midpoints = (map.narrow(0, 0, 255) + map.narrow(0, 1, 255)) / 2;
  q.absmax_codes = at::bucketize((centered / q.absmax_scales.clamp_min(1e-38f).unsqueeze(1))
                                     .clamp(-1, 1)
                                     .reshape({-1})
                                     .narrow(0, 0, blocks),
                                 midpoints)
                       .to(at::kByte)
                       .contiguous();
  return q;
}

const at::Tensor& Nf4ScaleMap() {
  // For each decimal exponent -6..0, the midpoints of an even split of [0.1, 1] into 2^i parts,
  // scaled, with both signs; then 0 and 1.
  static const at::Tensor map = [] {
    std::vector<at::Tensor> parts;
    for (int64_t i = 0; i < 7; ++i) {
      const int64_t items = (int64_t{1} << i) + 1;
      const at::Tensor bounds = at::linspace(0.1, 1, items, at::kFloat);
      const at::Tensor means =
          (bounds.narrow(0, 0, items - 1) + bounds.narrow(0, 1, items - 1)) / 2.0;
      const double scale = std::pow(10.0, static_cast<double>(i - 6));
      parts.push_back(means * scale);
      parts.push_back(means * -scale);
    }
    parts.push_back(at::tensor(std::vector<float>{0.0f, 1.0f}));
    return std::get<0>(at::cat(parts).sort()).contiguous();
  }();
  return map;
}

namespace {

// The map on `device`, copied there once (the dequantize asks for it on every tile). Kept for the
// process's life, never destroyed after the device's runtime is gone.
const at::Tensor& ScaleMapOn(const at::Device& device) {
  if (device.is_cpu()) return Nf4ScaleMap();
  static std::mutex mutex;
  static auto* copies = new std::map<std::string, at::Tensor>();
  std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& copy = (*copies)[device.str()];
  if (!copy.defined()) copy = Nf4ScaleMap().to(device);
  return copy;
}

// The scales of blocks [first, end) from ATen operations, on any device (the portable path).
at::Tensor AtenBlockScales(const Nf4Tensor& q, int64_t first, int64_t end) {
  if (!q.double_quantized()) return q.absmax.narrow(0, first, end - first);
  const at::Tensor group =
      at::arange(first, end, at::TensorOptions(at::kLong).device(q.absmax_codes.device()))
          .div_(kNf4DoubleQuantBlock, "floor");
  const at::Tensor codes = q.absmax_codes.narrow(0, first, end - first).to(at::kLong);
  return ScaleMapOn(codes.device()).index_select(0, codes) *
             q.absmax_scales.index_select(0, group).to(at::kFloat) +
         q.absmax_mean.to(at::kFloat);
}

}  // namespace

at::Tensor Nf4BlockScales(const Nf4Tensor& q) { return Nf4BlockScales(q, 0, q.blocks()); }

at::Tensor Nf4BlockScales(const Nf4Tensor& q, int64_t first, int64_t end) {
  if (!q.double_quantized() || !q.absmax_codes.device().is_cpu()) {
    return AtenBlockScales(q, first, end);
  }
  at::Tensor scales = at::empty({end - first}, at::TensorOptions().dtype(at::kFloat));
  BlockScaleReader(q).Read(first, end - first, scales.data_ptr<float>());
  return scales;
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
      AtenBlockScales(q, first, (end - 1) / q.block_size + 1).to(at::kFloat).contiguous();
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

namespace {

#if defined(ENGINE_KERNELS_WITH_CUDA)
cuda::Nf4Output CudaOutputOf(c10::ScalarType dtype) {
  return dtype == at::kFloat      ? cuda::Nf4Output::kFloat
         : dtype == at::kBFloat16 ? cuda::Nf4Output::kBFloat16
                                  : cuda::Nf4Output::kHalf;
}
#endif

// cuda::Nf4MatmulFewRows' conditions (nf4_cuda.h): rows of whole runs of 16 codes, power-of-two
// blocks of at least 16, at most kNf4FewRowsMax rows of x on the codes' device.
bool Nf4MatmulRowsOnCudaSupports(const Nf4Tensor& q, const at::Tensor& x, c10::ScalarType dtype) {
#if defined(ENGINE_KERNELS_WITH_CUDA)
  const int64_t block = q.block_size;
  return q.shape.size() == 2 && q.shape[1] % 16 == 0 && block >= 16 && (block & (block - 1)) == 0 &&
         reinterpret_cast<uintptr_t>(q.packed.data_ptr()) % 8 == 0 && x.dim() == 2 &&
         x.size(1) == q.shape[1] && x.size(0) <= cuda::kNf4FewRowsMax &&
         x.device() == q.packed.device() &&
         (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf);
#else
  (void)q, (void)x, (void)dtype;
  return false;
#endif
}

at::Tensor Nf4MatmulRowsOnCuda(const at::Tensor& x, const Nf4Tensor& q, c10::ScalarType dtype) {
#if defined(ENGINE_KERNELS_WITH_CUDA)
  const c10::cuda::CUDAGuard guard(q.packed.device());
  const int64_t n = x.size(0), rows = q.shape[0];
  // x rounded to the compute dtype, as the tiled path's GEMM takes it; then read as f32, in
  // 16-byte loads (a view that starts elsewhere is copied).
  at::Tensor xf = x.to(dtype).to(at::kFloat).contiguous();
  if (reinterpret_cast<uintptr_t>(xf.data_ptr()) % 16 != 0) xf = xf.clone();
  // On the codes' device whatever the Nf4Tensor's other parts hold: the kernel reads them there.
  const at::Tensor scales = Nf4BlockScales(q).to(q.packed.device(), at::kFloat).contiguous();
  at::Tensor y = at::empty({n, rows}, xf.options());
  if (n > 0 && rows > 0) {
    const int rc =
        cuda::Nf4MatmulFewRows(q.packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), q.block_size,
                               rows, q.shape[1], xf.data_ptr<float>(), n, CudaOutputOf(dtype),
                               y.data_ptr<float>(), at::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(rc == 0, "NF4 CUDA few-rows matmul failed to launch (cudaError ", rc, ")");
  }
  return y.to(dtype);
#else
  (void)q, (void)dtype;
  TORCH_CHECK(false, "Nf4MatmulRows: x is on ", x.device(), ", and this build has no CUDA kernels");
#endif
}

}  // namespace

at::Tensor DequantizeNf4RangeOffCpu(const Nf4Tensor& q, int64_t begin, int64_t end,
                                    c10::ScalarType dtype) {
#if defined(ENGINE_KERNELS_WITH_CUDA)
  if (q.packed.is_cuda() && begin < end) {
    const c10::cuda::CUDAGuard guard(q.packed.device());
    const int64_t first = begin / q.block_size;
    const at::Tensor scales = Nf4BlockScales(q, first, (end - 1) / q.block_size + 1)
                                  .to(q.packed.device(), at::kFloat)
                                  .contiguous();
    at::Tensor out = at::empty({end - begin}, q.packed.options().dtype(dtype));
    // Straight into `dtype`, one pass: on an H200 (bench/nf4_cuda_bench, 2026-11-29) 7x as fast
    // as the f32 kernel and a cast to bf16. The kernel indexes scales by absolute block; these
    // start at block `first`.
    const int rc = cuda::DequantizeNf4(
        q.packed.data_ptr<uint8_t>(), scales.data_ptr<float>() - first, q.block_size, begin, end,
        out.data_ptr(), CudaOutputOf(dtype), at::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(rc == 0, "NF4 CUDA dequantize failed to launch (cudaError ", rc, ")");
    return out;
  }
#endif
  return DequantizeNf4RangeWithAten(q, begin, end, dtype);
}

bool Nf4MatmulRowsSupports(const Nf4Tensor& q, const at::Tensor& x, c10::ScalarType dtype) {
  if (q.packed.is_cuda()) return Nf4MatmulRowsOnCudaSupports(q, x, dtype);
  return WholeBlocksVectorised() && CpuHasAvx2Fma() && q.packed.device().is_cpu() &&
         q.shape.size() == 2 && q.block_size % 8 == 0 && q.shape[1] % q.block_size == 0 &&
         x.dim() == 2 && x.size(1) == q.shape[1] && x.device().is_cpu() &&
         (dtype == at::kFloat || dtype == at::kBFloat16);
}

at::Tensor Nf4MatmulRows(const at::Tensor& x, const Nf4Tensor& q, c10::ScalarType dtype) {
  TORCH_CHECK(Nf4MatmulRowsSupports(q, x, dtype), "Nf4MatmulRows takes an x [n, ",
              q.shape.size() == 2 ? q.shape[1] : -1, "] on the codes' device (", q.packed.device(),
              "): f32 or bf16 compute on an AVX2 CPU with rows of whole blocks, or at most ",
              "16 rows on a GPU; got x ", x.sizes(), " on ", x.device(), " and ", dtype);
  if (q.packed.is_cuda()) return Nf4MatmulRowsOnCuda(x, q, dtype);
  const int64_t n = x.size(0), rows = q.shape[0];
  // x rounded to the compute dtype, as the tiled path's GEMM takes it; then read as f32.
  const at::Tensor xf = x.to(dtype).to(at::kFloat).contiguous();
  const BlockScaleReader scales(q);
  at::Tensor y = at::empty({n, rows}, at::TensorOptions().dtype(at::kFloat));
  if (n > 0 && rows > 0) {
    if (dtype == at::kFloat) {
      MatmulRowsTyped<false>(q, scales, xf.data_ptr<float>(), n, y.data_ptr<float>());
    } else {
      MatmulRowsTyped<true>(q, scales, xf.data_ptr<float>(), n, y.data_ptr<float>());
    }
  }
  return y.to(dtype);
}

at::Tensor DequantizeNf4(const Nf4Tensor& q, c10::ScalarType dtype) {
  return DequantizeNf4Range(q, 0, q.numel, dtype).view(q.shape);
}

}  // namespace engine::kernels
