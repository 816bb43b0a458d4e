// NF4 (QLoRA's 4-bit NormalFloat) quantization, laid out as bitsandbytes lays it out, so a weight
// quantized here means the same as theirs:
//   - the 16 values of kNf4Codebook, normalised to [-1, 1];
//   - blocks of `block_size` consecutive elements (row-major), each scaled by its f32 absmax;
//   - two codes per byte, the first element in the high nibble (an odd count pads a zero nibble).
// Optionally the absmax values are themselves quantized ("double quantization") as bitsandbytes'
// compress_statistics does it: their mean is subtracted, and the rest, in blocks of 256 scaled by
// their largest magnitude, is stored as the index of the nearest value of bitsandbytes' signed
// dynamic 8-bit map (Nf4ScaleMap()), so the codes mean what theirs mean. That brings the scales'
// cost from 32/block_size to about 8/block_size bits per element.
//
// CPU code, vectorised by the compiler with AVX2 clones where the CPU has AVX2, parallel over
// blocks through ATen's thread pool. Pure functions of their inputs; safe from any thread.
// Bad arguments (a block size that is not a power of two in [32, 4096], non-f32/bf16/f16 input,
// non-CPU tensors) throw c10::Error with a message; callers at plugin boundaries turn it into a
// Status.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

#include "engine_kernels/nf4_codebook.h"

namespace engine::kernels {

inline constexpr int64_t kNf4DoubleQuantBlock = 256;

struct Nf4Tensor {
  std::vector<int64_t> shape;  // of the dense tensor
  int64_t numel = 0;
  int64_t block_size = 64;
  at::Tensor packed;  // u8 [(numel + 1) / 2]
  // Without double quantization: f32 [blocks]. With it: undefined, and the three below are set.
  at::Tensor absmax;
  at::Tensor absmax_codes;   // u8 [blocks]: (absmax - mean) / scale as an index into Nf4ScaleMap()
  at::Tensor absmax_scales;  // f32 [ceil(blocks / 256)]: the largest |absmax - mean| of each 256
  at::Tensor absmax_mean;    // f32 [1]
  bool double_quantized() const { return !absmax.defined(); }
  int64_t blocks() const { return (numel + block_size - 1) / block_size; }
  // Bytes of every stored tensor together.
  int64_t storage_bytes() const;
};

bool IsValidNf4BlockSize(int64_t block_size);

// bitsandbytes' signed dynamic 8-bit map (create_dynamic_map(signed=True, max_exponent_bits=7,
// total_bits=8)): f32 [256], sorted, from -0.99296875 to 1. Made once; read-only.
const at::Tensor& Nf4ScaleMap();

// `weight` is f32, bf16 or f16 on the CPU; any shape.
Nf4Tensor QuantizeNf4(const at::Tensor& weight, int64_t block_size, bool double_quant);

// The per-block scales as f32 [blocks] (decoded when double-quantized).
at::Tensor Nf4BlockScales(const Nf4Tensor& q);
// The scales of blocks [first, end) only.
at::Tensor Nf4BlockScales(const Nf4Tensor& q, int64_t first, int64_t end);

// Elements [begin, end) of the flattened dense tensor, in `dtype` (f32, bf16 or f16), 1-D, on the
// device the packed codes are on: the CPU kernel, the CUDA kernel when this build has one, else
// DequantizeNf4RangeWithAten.
at::Tensor DequantizeNf4Range(const Nf4Tensor& q, int64_t begin, int64_t end,
                              c10::ScalarType dtype);
at::Tensor DequantizeNf4RangeOffCpu(const Nf4Tensor& q, int64_t begin, int64_t end,
                                    c10::ScalarType dtype);
// The same from plain ATen operations, on any device: the portable fallback (tested on the CPU
// against the kernel).
at::Tensor DequantizeNf4RangeWithAten(const Nf4Tensor& q, int64_t begin, int64_t end,
                                      c10::ScalarType dtype);

// The whole dense tensor in its shape.
at::Tensor DequantizeNf4(const Nf4Tensor& q, c10::ScalarType dtype);

// y [n, rows] = x [n, cols] @ W^T for a 2-D W [rows, cols] stored as `q`, in `dtype` (f32 or
// bf16: W exactly as DequantizeNf4Range gives it, x rounded to `dtype`, products and sums in f32,
// y rounded to `dtype`), without a dense copy of W: each row of W is decoded into a buffer that
// stays in L1 and multiplied there into every row of x. For a few rows of x (a generated token, a
// small batch), where dequantizing tiles for a GEMM costs a dense copy of W per call. Supports:
// CPU tensors, an AVX2 + FMA CPU, rows of whole blocks; or, in a build with the CUDA kernels,
// codes and x on one GPU (cuda::Nf4MatmulFewRows: at most 16 rows of x, f16 too).
bool Nf4MatmulRowsSupports(const Nf4Tensor& q, const at::Tensor& x, c10::ScalarType dtype);
at::Tensor Nf4MatmulRows(const at::Tensor& x, const Nf4Tensor& q, c10::ScalarType dtype);

// Whether the CPU dequantize kernel may take its AVX-512 path on a CPU that has one (the default);
// tests turn it off to check the AVX2 path on such a CPU. Set it while no kernel runs.
void SetNf4CpuAvx512Allowed(bool allowed);

// The code (0-15) nearest to each value of `normalized` (f32), i.e. what QuantizeNf4 stores.
at::Tensor Nf4NearestCodes(const at::Tensor& normalized);

}  // namespace engine::kernels
