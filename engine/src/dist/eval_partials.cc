#include "dist/eval_partials.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace engine {

void EvalPartials::Add(const ModelOutput& output) {
  const auto count = static_cast<double>(LossCountOf(output));
  loss_sum += output.loss.item<double>() * count;
  loss_count += count;
  for (const auto& [name, metric] : output.metrics) {
    metrics[name].sum += metric.sum;
    metrics[name].count += metric.count;
    metrics[name].exp_of_mean = metric.exp_of_mean;
  }
}

std::map<std::string, double> EvalPartials::Values() const {
  std::map<std::string, double> out;
  if (loss_count > 0) out["eval/loss"] = loss_sum / loss_count;
  // A metric nothing was counted for (eos_accuracy on text without an eos) has no value.
  for (const auto& [name, metric] : metrics) {
    if (metric.count > 0) out["eval/" + name] = metric.value();
  }
  return out;
}

StatusOr<bool> SumOverRanks(DataParallel& group, EvalPartials& partials) {
  // The metric names must agree before their numbers are added position by position: compare
  // their count and a hash of them through one max of (x, -x).
  std::string names;
  for (const auto& [name, metric] : partials.metrics) names += name + '\n';
  const double count = static_cast<double>(partials.metrics.size());
  const double hash = static_cast<double>(std::hash<std::string>()(names) & ((1ull << 52) - 1));
  ENGINE_ASSIGN_OR_RETURN(const std::vector<double> agreed,
                          group.Max({count, hash, -count, -hash}));
  if (agreed[0] != -agreed[2] || agreed[1] != -agreed[3]) return false;
  std::vector<double> values = {partials.loss_sum, partials.loss_count};
  for (const auto& [name, metric] : partials.metrics) {
    values.push_back(metric.sum);
    values.push_back(metric.count);
  }
  ENGINE_ASSIGN_OR_RETURN(const std::vector<double> sums, group.Sum(values));
  partials.loss_sum = sums[0];
  partials.loss_count = sums[1];
  size_t i = 2;
  for (auto& [name, metric] : partials.metrics) {
    metric.sum = sums[i++];
    metric.count = sums[i++];
  }
  return true;
}

}  // namespace engine
