// An evaluation's partial sums on one rank (each rank evaluates every world_size-th batch), and
// their sum over the ranks, so every rank ends with the metrics of the whole evaluation split.
//
// Ranks must have computed the same metric names; when they did not (a model whose metrics depend
// on the batch), SumOverRanks says so on every rank and leaves the partials alone, and the caller
// evaluates the whole split instead.
// Thread safety: the training thread only, like DataParallel.
#pragma once

#include <map>
#include <string>

#include "dist/data_parallel.h"
#include "engine/model.h"
#include "engine/status.h"

namespace engine {

struct EvalPartials {
  double loss_sum = 0;  // sum over the batches of loss x loss_count
  double loss_count = 0;
  std::map<std::string, Metric> metrics;

  void Add(const ModelOutput& output);
  // "eval/loss" and "eval/<metric>" values.
  std::map<std::string, double> Values() const;
};

// Replaces `partials` by their sum over the ranks of `group` and returns true, or returns false on
// every rank when the ranks' metric names differ. An error is a failed collective.
StatusOr<bool> SumOverRanks(DataParallel& group, EvalPartials& partials);

}  // namespace engine
