#include "data_split.h"

#include <cmath>
#include <random>

#include "engine/format.h"

namespace engine::plugins {

void CheckEvalFraction(double eval_fraction, OptionErrors* errors) {
  if (!(eval_fraction >= 0 && eval_fraction < 1)) {
    errors->Add("eval_fraction", "must be in [0, 1) (got " + FormatNumber(eval_fraction) + ")");
  }
}

SplitRows ShuffleAndSplit(int64_t n, uint64_t seed, double eval_fraction) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 rng(seed ^ 0xD161D5ULL);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(order[i], order[static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1))]);
  }
  const int64_t eval_count =
      static_cast<int64_t>(std::llround(eval_fraction * static_cast<double>(n)));
  SplitRows split;
  split.eval.assign(order.begin(), order.begin() + eval_count);
  split.train.assign(order.begin() + eval_count, order.end());
  return split;
}

}  // namespace engine::plugins
