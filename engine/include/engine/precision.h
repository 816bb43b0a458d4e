// Precision policy plugins: which dtype each group of parameters is stored, computed,
// differentiated and updated in, decided from a census of the real tensors (never from a
// model-level attribute).
//
// The engine takes the census, asks the policy for a plan, prints the plan, and applies it before
// the optimizer is built. The plan is what `engine check` shows and what runs.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/plugin.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace engine {

// One parameter or buffer as it really is.
struct TensorCensusEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  int64_t numel = 0;
  bool trainable = false;
  bool is_buffer = false;
};
using ParameterCensus = std::vector<TensorCensusEntry>;

struct PrecisionGroupPlan {
  // "trainable", "frozen", "buffers", ...
  std::string name;
  int64_t num_tensors = 0;
  int64_t num_elements = 0;
  // Bytes in storage after the plan is applied.
  int64_t bytes = 0;
  at::ScalarType storage = at::kFloat;
  at::ScalarType compute = at::kFloat;
  at::ScalarType grad = at::kFloat;
  at::ScalarType master = at::kFloat;
  at::ScalarType optimizer_state = at::kFloat;
  // Whether this group has gradients at all.
  bool has_grad = false;
};

struct PrecisionPlan {
  std::string policy;
  // Why this plan, in words (for `auto` and for casts it makes).
  std::string reason;
  std::vector<PrecisionGroupPlan> groups;
  bool loss_scaling = false;
};

class PrecisionPolicy {
 public:
  virtual ~PrecisionPolicy() = default;

  // Decides the plan. Refuses (with the group, the rule and the fix) what it cannot honour.
  virtual StatusOr<PrecisionPlan> MakePlan(const ParameterCensus& census) const = 0;
  // Casts the module's tensors to the plan's storage dtypes. Called once, before the optimizer
  // exists.
  virtual Status Apply(const PrecisionPlan& plan, torch::nn::Module& module) const = 0;
};

class PrecisionPolicyPlugin : public Plugin {
 public:
  PluginKind kind() const final { return PluginKind::kPrecisionPolicy; }

  virtual StatusOr<std::unique_ptr<PrecisionPolicy>> Create(
      const google::protobuf::Message& options) const = 0;
};

}  // namespace engine
