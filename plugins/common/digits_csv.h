// Reading scikit-learn's digits file (digits.csv.gz: 65 integers per line, 64 pixels 0..16 and a
// label 0..9) and splitting it by seed; shared by the `digits` and `digits_captions` loaders.
//
// Errors name the file and the line. Thread-compatible free functions; nothing is cached.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/status.h"

namespace engine::plugins {

inline constexpr int kDigitPixels = 64;
inline constexpr int kDigitClasses = 10;

struct DigitsTable {
  at::Tensor pixels;  // f32 [n, 64], values 0..16
  at::Tensor labels;  // i64 [n]
  std::string content_hash;
};

// Reads a plain or gzip-compressed file (zlib reads both).
StatusOr<std::string> ReadMaybeCompressed(const std::filesystem::path& path);

StatusOr<DigitsTable> ReadDigitsCsv(const std::filesystem::path& path);

// Rows 0..n-1 in a deterministic shuffle by `seed`; the first round(eval_fraction * n) are the eval
// split, the rest train.
struct SplitRows {
  std::vector<int64_t> train;
  std::vector<int64_t> eval;
};
SplitRows ShuffleAndSplit(int64_t n, uint64_t seed, double eval_fraction);

}  // namespace engine::plugins
