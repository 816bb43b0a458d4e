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

}  // namespace engine::kernels::cuda
