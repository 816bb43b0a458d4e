// Precision policy plugins: which dtype each parameter is stored, computed, differentiated and
// updated in, decided from a census of the real tensors (never from a model-level attribute) and a
// measured description of the device.
//
// A policy is declarative: it turns a PrecisionRequest into a PrecisionPlan and refuses, with the
// rule and the fix, what it cannot honour. The engine prints the plan (`engine check`), checks its
// invariants before step 0, and carries it out: storage casts, f32 master weights, the autocast
// context, loss scaling and the optimizer step path. engine/precision_kit.h builds standard plans;
// the built-in policies are thin layers over it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/plugin.h"

namespace engine {

// What a device can compute, probed on this machine with this LibTorch rather than assumed.
struct DeviceCapability {
  std::string device = "cpu";  // "cpu", "cuda:0"
  std::string name;            // "AMD EPYC 9R14", "NVIDIA TITAN RTX"
  bool cuda = false;
  int compute_capability = 0;  // CUDA: major * 10 + minor (75 = sm_75); 0 on the CPU
  bool bf16 = false;           // bf16 matrix products run here at all
  bool bf16_fast = false;      // and in hardware (CUDA sm_80+; CPU avx512_bf16 or amx_bf16)
  bool fp16 = false;           // fp16 matrix products run here
  bool bf16_autocast = false;  // this LibTorch's autocast can target bf16 on this device type
  bool fp16_autocast = false;  // ... and fp16

  // "cuda:0 NVIDIA TITAN RTX (sm_75)", "cpu AMD EPYC 9R14 (avx512_bf16)".
  std::string Describe() const;
};

// One parameter or buffer as it really is.
struct TensorCensusEntry {
  std::string name;
  // The module group: the first name component, or the first two under a generic container
  // ("model.layers", "visual", "lm_head").
  std::string group;
  at::ScalarType dtype = at::kFloat;
  int64_t numel = 0;
  bool trainable = false;
  bool is_buffer = false;

  int64_t bytes() const { return numel * static_cast<int64_t>(c10::elementSize(dtype)); }
};
using ParameterCensus = std::vector<TensorCensusEntry>;

// Declared by a model: the computations of the parameters matching `pattern` run in `dtype`
// whatever the autocast dtype (the model runs them with autocast off). Declaring f32 also keeps
// their storage in f32.
struct ComputeDeclaration {
  std::string pattern;  // a glob over parameter names
  at::ScalarType dtype = at::kFloat;
  std::string reason;
};

struct PrecisionRequest {
  ParameterCensus census;  // as loaded, trainable selection applied
  DeviceCapability device;
  std::vector<ComputeDeclaration> declared_compute;
};

// What happens to one parameter or buffer.
struct TensorPlan {
  std::string name;
  int64_t numel = 0;
  bool trainable = false;
  bool is_buffer = false;
  bool kept_fp32 = false;
  at::ScalarType storage = at::kFloat;  // after the plan is applied
  at::ScalarType compute = at::kFloat;  // what its matrix products run in
  // Trainable tensors only (Undefined otherwise): the gradient backward produces (= storage), the
  // weights the optimizer updates, and the optimizer's state.
  at::ScalarType grad = at::ScalarType::Undefined;
  at::ScalarType master = at::ScalarType::Undefined;
  at::ScalarType optimizer_state = at::ScalarType::Undefined;
};

// Tensors with the same role and dtypes, summed.
struct PrecisionGroupPlan {
  std::string name;  // "trainable", "frozen", "trainable, kept f32", "buffers", ...
  int64_t num_tensors = 0;
  int64_t num_elements = 0;
  int64_t bytes = 0;  // storage after the plan, plus f32 masters where there are any
  at::ScalarType storage = at::kFloat;
  at::ScalarType compute = at::kFloat;
  at::ScalarType grad = at::ScalarType::Undefined;
  at::ScalarType master = at::ScalarType::Undefined;
  at::ScalarType optimizer_state = at::ScalarType::Undefined;
  bool has_grad = false;
};

struct LossScalingPlan {
  bool enabled = false;
  double initial_scale = 65536;
  double growth_factor = 2;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

struct PrecisionPlan {
  std::string requested;  // the plugin the pipeline names, e.g. "auto"
  std::string policy;     // what runs, e.g. "bf16-mixed"
  std::string reason;     // why, in words
  // The autocast dtype on the stage's device; nullopt: no autocast.
  std::optional<at::ScalarType> autocast;
  LossScalingPlan loss_scaling;
  bool unsafe_low_precision_updates = false;
  std::vector<TensorPlan> tensors;         // census order
  std::vector<PrecisionGroupPlan> groups;  // derived from tensors
  std::vector<std::string> warnings;       // printed with the plan, logged when the stage starts
};

class PrecisionPolicy {
 public:
  virtual ~PrecisionPolicy() = default;

  // Decides the plan. Refuses what the device, the census or the options rule out, naming the rule
  // and the fix. A problem tied to one option goes to `field_errors` with its path
  // ("keep_fp32[1]"), which the engine reports at that option's position.
  virtual StatusOr<PrecisionPlan> MakePlan(const PrecisionRequest& request,
                                           OptionErrors* field_errors) const = 0;
};

class PrecisionPolicyPlugin : public Plugin {
 public:
  PluginKind kind() const final { return PluginKind::kPrecisionPolicy; }

  virtual StatusOr<std::unique_ptr<PrecisionPolicy>> Create(
      const google::protobuf::Message& options) const = 0;
};

}  // namespace engine
