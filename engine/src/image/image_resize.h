// Bicubic resizing of 8-bit RGB images with Pillow's arithmetic (Image.resize(size, BICUBIC)), the
// resampling transformers' image processors use through PIL: a separable cubic convolution
// (a = -0.5) whose support widens with the downscaling factor (antialiasing), coefficients in
// 22-bit fixed point, a horizontal pass rounded to 8 bits and then a vertical one. Same inputs,
// same bytes as Pillow.
//
// Pure function; any thread. Sizes must be positive (the caller checks them).
#pragma once

#include <cstdint>
#include <vector>

namespace engine {

// `rgb` holds height x width x 3 bytes; returns out_height x out_width x 3.
std::vector<uint8_t> ResizeBicubicLikePillow(const std::vector<uint8_t>& rgb, int64_t width,
                                             int64_t height, int64_t out_width, int64_t out_height);

}  // namespace engine
