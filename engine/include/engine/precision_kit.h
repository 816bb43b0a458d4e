// Building blocks for precision policies: the standard plan for a policy, the checks every plan
// must pass, and the validation of the shared options (engine.proto.PrecisionOptions).
//
//   engine::PolicySpec spec = *engine::StandardPolicy("bf16-true");
//   return engine::BuildPolicyPlan(request, options, spec, "bf16-true", field_errors);
//
// The built-in policies (fp32, bf16-mixed, fp16-mixed, bf16-true, fp16-true, auto) are thin layers
// over these; a third-party policy can use them or build its own plan, which the engine checks with
// CheckPlanInvariants before step 0 either way.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "engine/plugin.h"
#include "engine/precision.h"
#include "engine/precision.pb.h"

namespace engine {

// The shape of a standard policy.
struct PolicySpec {
  std::string policy;                   // "bf16-true"
  at::ScalarType compute = at::kFloat;  // the dtype matrix products run in
  bool low_storage = false;             // *-true: weights stored in `compute`
  bool loss_scaling = false;            // fp16 policies
};

// fp32, bf16-mixed, fp16-mixed, bf16-true, fp16-true; nullopt for anything else.
std::optional<PolicySpec> StandardPolicy(std::string_view name);

// Option problems that do not depend on the model: contradictions with `spec` (nullptr for `auto`),
// bad loss-scaling values, malformed globs. Reported with field paths
// ("loss_scaling.growth_factor").
void ValidatePrecisionOptions(const proto::PrecisionOptions& options, const PolicySpec* spec,
                              OptionErrors* errors);

// The dtype most floating-point parameter bytes are stored in, when it is bf16 or f16.
std::optional<at::ScalarType> DominantLowPrecision(const ParameterCensus& census);

// Whether `device` can run `spec`; the error names the device, what it lacks and what to use.
Status CheckDeviceSupports(const PolicySpec& spec, const DeviceCapability& device);

// Whether the weights as stored allow `spec` (fp16 compute on a model stored in bf16 is refused).
Status CheckCensusAllows(const PolicySpec& spec, const ParameterCensus& census);

// The plan for `spec`: every tensor's storage, compute, grad, master and optimizer-state dtypes,
// loss scaling and warnings. Problems with one option (a keep_fp32 pattern that matches nothing) go
// to `field_errors`; everything else comes back as the error.
StatusOr<PrecisionPlan> BuildPolicyPlan(const PrecisionRequest& request,
                                        const proto::PrecisionOptions& options,
                                        const PolicySpec& spec, const std::string& requested,
                                        OptionErrors* field_errors);

// The invariants every plan must hold before step 0: each trainable tensor has a master
// and optimizer state of the master's dtype; loss scaling implies f32 masters for every trainable
// tensor; bf16 never scales; kept-f32 tensors are stored in f32; the device computes the plan's
// dtypes. The error names the group, the rule and the fix.
Status CheckPlanInvariants(const PrecisionPlan& plan, const DeviceCapability& device);

// Sums `plan.tensors` into `plan.groups` (by role and dtypes), with the bytes of storage and
// masters.
void GroupTensorPlans(PrecisionPlan* plan);

}  // namespace engine
