#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "engine_kernels/nf4_codebook.h"
#include "engine_kernels/nf4_cuda.h"

namespace engine::kernels::cuda {
namespace {

__constant__ float kCodebook[16] = {
    kNf4Codebook[0],  kNf4Codebook[1],  kNf4Codebook[2],  kNf4Codebook[3],
    kNf4Codebook[4],  kNf4Codebook[5],  kNf4Codebook[6],  kNf4Codebook[7],
    kNf4Codebook[8],  kNf4Codebook[9],  kNf4Codebook[10], kNf4Codebook[11],
    kNf4Codebook[12], kNf4Codebook[13], kNf4Codebook[14], kNf4Codebook[15]};

// One packed byte (two elements) per thread and iteration; block sizes are powers of two, so the
// scale index is a shift. Elements outside [begin, end) are skipped at both ends.
__global__ void DequantizeKernel(const uint8_t* packed, const float* scales, int block_shift,
                                 int64_t begin, int64_t end, float* out) {
  const int64_t first_byte = begin >> 1;
  const int64_t last_byte = (end + 1) >> 1;  // exclusive
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = first_byte + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < last_byte; b += stride) {
    const uint8_t byte = packed[b];
    const int64_t i = b << 1;  // both elements share a block: block sizes are even
    const float scale = scales[i >> block_shift];
    if (i >= begin) out[i - begin] = kCodebook[byte >> 4] * scale;
    if (i + 1 < end) out[i + 1 - begin] = kCodebook[byte & 0x0f] * scale;
  }
}

// The codebook in shared memory: threads of a warp index it with different nibbles, which the
// constant cache would serve one address at a time; 16 floats sit in 16 banks.
__device__ void LoadCodebook(float* codebook) {
  if (threadIdx.x < 16) codebook[threadIdx.x] = kCodebook[threadIdx.x];
  __syncthreads();
}

template <typename T>
__device__ T Rounded(float value);
template <>
__device__ float Rounded<float>(float value) {
  return value;
}
template <>
__device__ __nv_bfloat16 Rounded<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}
template <>
__device__ __half Rounded<__half>(float value) {
  return __float2half_rn(value);
}

// Elements [begin, end) one packed byte at a time (any alignment, any block size).
template <typename T>
__global__ void DequantizeBytes(const uint8_t* packed, const float* scales, int block_shift,
                                int64_t begin, int64_t end, T* out) {
  __shared__ float codebook[16];
  LoadCodebook(codebook);
  const int64_t first_byte = begin >> 1;
  const int64_t last_byte = (end + 1) >> 1;  // exclusive
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = first_byte + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < last_byte; b += stride) {
    const uint8_t byte = packed[b];
    const int64_t i = b << 1;  // both elements share a block: block sizes are even
    const float scale = scales[i >> block_shift];
    if (i >= begin) out[i - begin] = Rounded<T>(codebook[byte >> 4] * scale);
    if (i + 1 < end) out[i + 1 - begin] = Rounded<T>(codebook[byte & 0x0f] * scale);
  }
}

// `groups` runs of 16 elements from `begin` (a multiple of 16; blocks of at least 16 elements, so
// a run has one scale): 8 bytes in with one load, 16 values out with 16-byte stores.
template <typename T>
__global__ void DequantizeSixteens(const uint8_t* packed, const float* scales, int block_shift,
                                   int64_t begin, int64_t groups, T* out) {
  __shared__ float codebook[16];
  LoadCodebook(codebook);
  const uint2* words = reinterpret_cast<const uint2*>(packed + (begin >> 1));
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += stride) {
    const uint2 word = words[g];
    const float scale = scales[(begin + 16 * g) >> block_shift];
    alignas(16) T values[16];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const unsigned lo = (word.x >> (8 * k)) & 0xffu, hi = (word.y >> (8 * k)) & 0xffu;
      values[2 * k] = Rounded<T>(codebook[lo >> 4] * scale);
      values[2 * k + 1] = Rounded<T>(codebook[lo & 0x0fu] * scale);
      values[8 + 2 * k] = Rounded<T>(codebook[hi >> 4] * scale);
      values[8 + 2 * k + 1] = Rounded<T>(codebook[hi & 0x0fu] * scale);
    }
    uint4* destination = reinterpret_cast<uint4*>(out + 16 * g);
    const uint4* source = reinterpret_cast<const uint4*>(values);
#pragma unroll
    for (int k = 0; k < static_cast<int>(sizeof(T)); ++k) destination[k] = source[k];
  }
}

// Blocks for `work` items of 256 threads, capped (the kernels loop over the rest).
int LaunchBlocks(int64_t work) {
  const int64_t wanted = (work + 255) / 256;
  return static_cast<int>(wanted < 65535 * 8 ? wanted : 65535 * 8);
}

template <typename T>
int DequantizeAs(const uint8_t* packed, const float* scales, int64_t block_size, int block_shift,
                 int64_t begin, int64_t end, T* out, cudaStream_t stream) {
  int64_t done = begin;
  const bool aligned = begin % 16 == 0 && block_size >= 16 &&
                       reinterpret_cast<uintptr_t>(packed + (begin >> 1)) % 8 == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (aligned && end - begin >= 16) {
    const int64_t groups = (end - begin) / 16;
    DequantizeSixteens<T>
        <<<LaunchBlocks(groups), 256, 0, stream>>>(packed, scales, block_shift, begin, groups, out);
    done = begin + 16 * groups;
  }
  if (done < end) {
    DequantizeBytes<T><<<LaunchBlocks(((end + 1) >> 1) - (done >> 1)), 256, 0, stream>>>(
        packed, scales, block_shift, done, end, out + (done - begin));
  }
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
__device__ float Widened(T value);
template <>
__device__ float Widened<float>(float value) {
  return value;
}
template <>
__device__ float Widened<__nv_bfloat16>(__nv_bfloat16 value) {
  return __bfloat162float(value);
}
template <>
__device__ float Widened<__half>(__half value) {
  return __half2float(value);
}

// One warp per weight row: each lane takes runs of 16 codes (8 bytes, one scale), rounds the 16
// weights to W and back, and adds their products with the n rows of x to its n sums, which the
// warp then adds up. Blocks of 256 threads hold 8 rows.
template <typename W>
__global__ void FewRowsKernel(const uint8_t* packed, const float* scales, int block_shift,
                              int64_t rows, int64_t cols, const float* x, int n, float* y) {
  __shared__ float codebook[16];
  LoadCodebook(codebook);
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  float sums[kNf4FewRowsMax] = {};
  const uint2* words = reinterpret_cast<const uint2*>(packed + row * (cols / 2));
  const int64_t groups = cols / 16;
  for (int64_t g = lane; g < groups; g += 32) {
    const uint2 word = words[g];
    const float scale = scales[(row * cols + 16 * g) >> block_shift];
    float w[16];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const unsigned lo = (word.x >> (8 * k)) & 0xffu, hi = (word.y >> (8 * k)) & 0xffu;
      w[2 * k] = Widened(Rounded<W>(codebook[lo >> 4] * scale));
      w[2 * k + 1] = Widened(Rounded<W>(codebook[lo & 0x0fu] * scale));
      w[8 + 2 * k] = Widened(Rounded<W>(codebook[hi >> 4] * scale));
      w[8 + 2 * k + 1] = Widened(Rounded<W>(codebook[hi & 0x0fu] * scale));
    }
#pragma unroll
    for (int t = 0; t < kNf4FewRowsMax; ++t) {
      if (t >= n) break;
      const float4* xs = reinterpret_cast<const float4*>(x + t * cols + 16 * g);
      float sum = sums[t];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 v = xs[q];
        sum += v.x * w[4 * q] + v.y * w[4 * q + 1] + v.z * w[4 * q + 2] + v.w * w[4 * q + 3];
      }
      sums[t] = sum;
    }
  }
#pragma unroll
  for (int t = 0; t < kNf4FewRowsMax; ++t) {
    if (t >= n) break;
    float sum = sums[t];
    for (int offset = 16; offset > 0; offset /= 2)
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) y[t * rows + row] = sum;
  }
}

}  // namespace

int Nf4MatmulFewRows(const uint8_t* packed, const float* scales, int64_t block_size, int64_t rows,
                     int64_t cols, const float* x, int64_t n, Nf4Output weight_type, float* y,
                     void* stream) {
  if (rows <= 0 || n <= 0) return 0;
  if (n > kNf4FewRowsMax || cols % 16 != 0 || block_size < 16 ||
      (block_size & (block_size - 1)) != 0 || reinterpret_cast<uintptr_t>(packed) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  int block_shift = 0;
  while ((int64_t{1} << block_shift) < block_size) ++block_shift;
  const auto on = static_cast<cudaStream_t>(stream);
  const int rows_per_block = 8;
  const int64_t wanted = (rows + rows_per_block - 1) / rows_per_block;
  if (wanted > 2147483647) return static_cast<int>(cudaErrorInvalidValue);
  const auto blocks = static_cast<unsigned>(wanted);
  const int count = static_cast<int>(n);
  switch (weight_type) {
    case Nf4Output::kFloat:
      FewRowsKernel<float><<<blocks, 32 * rows_per_block, 0, on>>>(packed, scales, block_shift,
                                                                   rows, cols, x, count, y);
      break;
    case Nf4Output::kBFloat16:
      FewRowsKernel<__nv_bfloat16><<<blocks, 32 * rows_per_block, 0, on>>>(
          packed, scales, block_shift, rows, cols, x, count, y);
      break;
    case Nf4Output::kHalf:
      FewRowsKernel<__half><<<blocks, 32 * rows_per_block, 0, on>>>(packed, scales, block_shift,
                                                                    rows, cols, x, count, y);
      break;
  }
  return static_cast<int>(cudaGetLastError());
}

int DequantizeNf4(const uint8_t* packed, const float* scales, int64_t block_size, int64_t begin,
                  int64_t end, void* out, Nf4Output out_type, void* stream) {
  if (end <= begin) return 0;
  if (block_size < 2 || (block_size & (block_size - 1)) != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  int block_shift = 0;
  while ((int64_t{1} << block_shift) < block_size) ++block_shift;
  const auto on = static_cast<cudaStream_t>(stream);
  switch (out_type) {
    case Nf4Output::kFloat:
      return DequantizeAs(packed, scales, block_size, block_shift, begin, end,
                          static_cast<float*>(out), on);
    case Nf4Output::kBFloat16:
      return DequantizeAs(packed, scales, block_size, block_shift, begin, end,
                          static_cast<__nv_bfloat16*>(out), on);
    case Nf4Output::kHalf:
      return DequantizeAs(packed, scales, block_size, block_shift, begin, end,
                          static_cast<__half*>(out), on);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int DequantizeNf4F32(const uint8_t* packed, const float* scales, int64_t block_size, int64_t begin,
                     int64_t end, float* out, void* stream) {
  if (end <= begin) return 0;
  if (block_size < 2 || (block_size & (block_size - 1)) != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  int block_shift = 0;
  while ((int64_t{1} << block_shift) < block_size) ++block_shift;
  const int threads = 256;
  const int64_t bytes = ((end + 1) >> 1) - (begin >> 1);
  const int64_t wanted = (bytes + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 65535 * 8 ? wanted : 65535 * 8);
  DequantizeKernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      packed, scales, block_shift, begin, end, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace engine::kernels::cuda
