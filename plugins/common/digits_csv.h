// Reading scikit-learn's digits file (digits.csv.gz: 65 integers per line, 64 pixels 0..16 and a
// label 0..9); shared by the `digits` and `digits_captions` loaders.
//
// Errors name the file and the line. Thread-compatible free functions; nothing is cached.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "engine/status.h"

namespace engine::plugins {

inline constexpr int kDigitPixels = 64;
inline constexpr int kDigitClasses = 10;

struct DigitsTable {
  at::Tensor pixels;  // f32 [n, 64], values 0..16
  at::Tensor labels;  // i64 [n]
  std::string content_hash;
};

StatusOr<DigitsTable> ReadDigitsCsv(const std::filesystem::path& path);

}  // namespace engine::plugins
