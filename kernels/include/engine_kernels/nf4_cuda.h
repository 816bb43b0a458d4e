// CUDA NF4 dequantization, the device twin of DequantizeNf4Range (nf4.h) for f32 block scales.
// Built only when nvcc is present (kernels/CMakeLists.txt); raw device pointers, no LibTorch
// types, so it compiles without LibTorch's CUDA headers. Returns the launch's cudaError_t as an
// int (0 on success); the caller owns every buffer and the stream.
#pragma once

#include <cstdint>

namespace engine::kernels::cuda {

// out[i - begin] = codebook[nibble(i)] * scales[i / block_size] for i in [begin, end), as f32.
// block_size must be a power of two (cudaErrorInvalidValue otherwise).
int DequantizeNf4F32(const uint8_t* packed, const float* scales, int64_t block_size, int64_t begin,
                     int64_t end, float* out, void* stream);

// The element types DequantizeNf4 writes.
enum class Nf4Output : int { kFloat = 0, kBFloat16 = 1, kHalf = 2 };

// The same product, rounded once (to nearest even) into `out_type`: what DequantizeNf4F32 and a
// cast compute, in one pass that writes the output dtype directly. Where the range starts on a
// 16-element boundary and blocks hold at least 16 elements, each thread decodes 8 packed bytes
// with one load and writes its 16 values with 16-byte stores; other elements one byte at a time.
// block_size must be a power of two (cudaErrorInvalidValue otherwise); `out` as aligned as
// cudaMalloc's. What DequantizeNf4Range (nf4.h) runs for codes on a GPU.
int DequantizeNf4(const uint8_t* packed, const float* scales, int64_t block_size, int64_t begin,
                  int64_t end, void* out, Nf4Output out_type, void* stream);

// A few rows through a 4-bit weight without dequantizing it: y [n, rows] = x [n, cols] @ W^T for
// W the NF4 codes [rows, cols] (row-major, `scales` per block as above), n <= kNf4FewRowsMax. Each
// warp decodes one weight row from its codes in registers, each weight rounded to `weight_type`
// as DequantizeNf4 would write it and widened again; x (f32, already rounded to the compute dtype
// by the caller) and the sums are f32; y is f32. Needs cols % 16 == 0 and block_size >= 16 (a
// power of two); cudaErrorInvalidValue otherwise. The device twin of Nf4MatmulRows (nf4.h), which
// runs it for codes on a GPU. Each warp reads all of x, so its time grows with n: on an H200 it
// beat dequantize + GEMM for 1 row only (bench/nf4_cuda_bench, 4096 x 4096).
inline constexpr int64_t kNf4FewRowsMax = 16;
int Nf4MatmulFewRows(const uint8_t* packed, const float* scales, int64_t block_size, int64_t rows,
                     int64_t cols, const float* x, int64_t n, Nf4Output weight_type, float* y,
                     void* stream);

}  // namespace engine::kernels::cuda
