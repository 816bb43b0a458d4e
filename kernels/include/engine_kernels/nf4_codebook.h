// bitsandbytes' NF4 values, in code order (code 7 is exactly zero): the one copy that the CPU
// kernels (nf4.h) and the CUDA kernels (nf4_cuda.h) decode with, so both give a code the same
// value.
//
// constexpr, so CUDA's __constant__ memory is initialised from it element by element at compile
// time.
#pragma once

#include <array>

namespace engine::kernels {

inline constexpr std::array<float, 16> kNf4Codebook = {-1.0f,
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

}  // namespace engine::kernels
