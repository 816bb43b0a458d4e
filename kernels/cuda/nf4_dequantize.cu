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

}  // namespace

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
