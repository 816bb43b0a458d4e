// The `fp32` precision policy: every floating-point tensor is stored, computed, differentiated and
// updated in float32. Tensors loaded in another floating dtype are cast to float32, and the plan
// says how many and from what.
#include <ATen/core/grad_mode.h>
#include <google/protobuf/empty.pb.h>
#include <torch/nn/module.h>

#include <map>

#include "engine/dtype.h"
#include "engine/precision.h"

namespace engine::plugins {
namespace {

class Fp32Policy : public PrecisionPolicy {
 public:
  StatusOr<PrecisionPlan> MakePlan(const ParameterCensus& census) const override {
    PrecisionPlan plan;
    plan.policy = "fp32";
    std::map<std::string, PrecisionGroupPlan> groups;
    std::map<std::string, int64_t> casts;  // source dtype -> tensors cast
    for (const TensorCensusEntry& t : census) {
      const std::string name = t.is_buffer ? "buffers" : (t.trainable ? "trainable" : "frozen");
      PrecisionGroupPlan& g = groups[name];
      g.name = name;
      const bool floating = at::isFloatingType(t.dtype);
      const at::ScalarType stored = floating ? at::kFloat : t.dtype;
      if (floating && t.dtype != at::kFloat) ++casts[std::string(DtypeShortName(t.dtype))];
      g.num_tensors += 1;
      g.num_elements += t.numel;
      g.bytes += t.numel * static_cast<int64_t>(c10::elementSize(stored));
      g.storage = g.compute = g.grad = g.master = g.optimizer_state = stored;
      g.has_grad = t.trainable;
    }
    for (const char* name : {"trainable", "frozen", "buffers"}) {
      auto it = groups.find(name);
      if (it != groups.end()) plan.groups.push_back(it->second);
    }
    if (casts.empty()) {
      plan.reason = "every floating-point tensor is already f32";
    } else {
      plan.reason = "casts to f32:";
      for (const auto& [dtype, count] : casts) {
        plan.reason += " " + std::to_string(count) + " " + dtype + " tensor(s)";
      }
    }
    return plan;
  }

  // Only floating-point tensors change; integer buffers (positions, counters) keep their dtype,
  // which Module::to(dtype) would not respect.
  Status Apply(const PrecisionPlan&, torch::nn::Module& module) const override {
    at::NoGradGuard no_grad;
    for (auto& p : module.named_parameters(/*recurse=*/true)) {
      if (at::isFloatingType(p.value().scalar_type()) && p.value().scalar_type() != at::kFloat) {
        p.value().set_data(p.value().to(at::kFloat));
      }
    }
    for (auto& b : module.named_buffers(/*recurse=*/true)) {
      if (at::isFloatingType(b.value().scalar_type()) && b.value().scalar_type() != at::kFloat) {
        b.value().set_data(b.value().to(at::kFloat));
      }
    }
    return Status::Ok();
  }
};

class Fp32PolicyPlugin : public PrecisionPolicyPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return google::protobuf::Empty::default_instance();
  }
  StatusOr<std::unique_ptr<PrecisionPolicy>> Create(
      const google::protobuf::Message&) const override {
    return std::unique_ptr<PrecisionPolicy>(new Fp32Policy());
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("fp32", ENGINE_KIND_PRECISION_POLICY, "0.1.0",
              "everything in float32: storage, compute, gradients, masters and optimizer state",
              engine::plugins::Fp32PolicyPlugin)
