#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace engine {

double LearningRateAt(const proto::Optimizer& optimizer, int64_t step, int64_t total_steps) {
  const double peak = optimizer.learning_rate();
  const proto::LrSchedule& s = optimizer.lr_schedule();
  const int64_t warmup = static_cast<int64_t>(s.warmup_steps());
  if (s.kind() != proto::LrSchedule::CONSTANT && step < warmup) {
    return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  }
  if (s.kind() != proto::LrSchedule::COSINE) return peak;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup - 1);
  const double progress =
      std::clamp(static_cast<double>(step - warmup) / static_cast<double>(decay_steps), 0.0, 1.0);
  const double floor = peak * s.min_lr_ratio();
  return floor + (peak - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace engine
