#include <cuda_runtime.h>

#include "engine_kernels/nf4_cuda.h"

namespace engine::kernels::cuda {
namespace {

__constant__ float kCodebook[16] = {-1.0f,
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

__global__ void DequantizeKernel(const uint8_t* packed, const float* scales, int64_t block_size,
                                 int64_t begin, int64_t end, float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < end;
       i += stride) {
    const uint8_t byte = packed[i >> 1];
    const uint8_t code = (i & 1) ? (byte & 0x0f) : (byte >> 4);
    out[i - begin] = kCodebook[code] * scales[i / block_size];
  }
}

}  // namespace

int DequantizeNf4F32(const uint8_t* packed, const float* scales, int64_t block_size, int64_t begin,
                     int64_t end, float* out, void* stream) {
  if (end <= begin) return 0;
  const int threads = 256;
  const int64_t wanted = (end - begin + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 65535 ? wanted : 65535);
  DequantizeKernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      packed, scales, block_size, begin, end, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace engine::kernels::cuda
