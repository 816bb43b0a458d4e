// How the built-in data loaders hold out an evaluation split: the `eval_fraction` option, checked
// the same way everywhere, and a deterministic shuffle by the stage seed.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/plugin.h"

namespace engine::plugins {

// Adds an error under "eval_fraction" unless it is in [0, 1).
void CheckEvalFraction(double eval_fraction, OptionErrors* errors);

// Rows 0..n-1 in a deterministic shuffle by `seed`; the first round(eval_fraction * n) are the eval
// split, the rest train.
struct SplitRows {
  std::vector<int64_t> train;
  std::vector<int64_t> eval;
};
SplitRows ShuffleAndSplit(int64_t n, uint64_t seed, double eval_fraction);

}  // namespace engine::plugins
