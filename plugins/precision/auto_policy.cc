// The `auto` precision policy: the census, the device's measured capabilities and the options
// decide one of the standard policies, and the plan says why.
//
//   device computes bf16 in hardware (CUDA sm_80+, CPU avx512_bf16/amx_bf16):
//       weights stored in bf16 -> bf16-true (frozen weights stay bf16, f32 masters)
//       otherwise              -> bf16-mixed
//   CUDA without bf16 (sm_75 and older) but with fp16:
//       weights stored in bf16 -> fp32 (fp16 cannot hold a bf16 model's range)
//       weights stored in fp16 -> fp16-true (f32 masters, loss scaling)
//       otherwise              -> fp16-mixed (loss scaling)
//   anything else (a CPU without bf16 hardware) -> fp32
//
// options.compute_dtype pins the dtype: fp32, or bf16 / fp16 when the device can compute in it.
#include "engine/dtype.h"
#include "standard_policy.h"

namespace engine::plugins {
namespace {

std::string Dt(at::ScalarType t) { return std::string(DtypeShortName(t)); }

struct Choice {
  std::string policy;
  std::string why;
};

StatusOr<Choice> Choose(const PrecisionRequest& request, const proto::PrecisionOptions& options) {
  const DeviceCapability& d = request.device;
  const std::optional<at::ScalarType> stored = DominantLowPrecision(request.census);
  const bool bf16_ok = d.bf16 && d.bf16_autocast;
  const bool fp16_ok = d.fp16 && d.fp16_autocast;
  const std::string device = d.Describe();
  const std::string stored_text =
      stored ? "the weights are stored in " + Dt(*stored) : "the weights are stored in f32";

  if (options.has_compute_dtype()) {
    const std::string& pin = options.compute_dtype();
    if (pin == "fp32" || pin == "f32") return Choice{"fp32", "compute_dtype pins f32"};
    if (pin == "bf16") {
      ENGINE_RETURN_IF_ERROR(CheckDeviceSupports(*StandardPolicy("bf16-mixed"), d));
      return Choice{stored == at::kBFloat16 ? "bf16-true" : "bf16-mixed",
                    "compute_dtype pins bf16, and " + stored_text};
    }
    ENGINE_RETURN_IF_ERROR(CheckDeviceSupports(*StandardPolicy("fp16-mixed"), d));
    return Choice{stored == at::kHalf ? "fp16-true" : "fp16-mixed",
                  "compute_dtype pins fp16, and " + stored_text};
  }
  if (bf16_ok && d.bf16_fast) {
    if (stored == at::kBFloat16) {
      return Choice{"bf16-true", device + " computes bf16 in hardware and " + stored_text +
                                     ": frozen weights stay bf16, trainable ones get f32 masters"};
    }
    return Choice{"bf16-mixed", device + " computes bf16 in hardware; " + stored_text +
                                    ", so they stay f32 and matrix products run in bf16"};
  }
  if (d.cuda && fp16_ok) {
    const std::string no_bf16 = device + " has no bf16 (it needs compute capability 8.0)";
    if (stored == at::kBFloat16) {
      return Choice{"fp32", no_bf16 + ", and " + stored_text +
                                ", whose range fp16 cannot hold; f32 is the safe choice"};
    }
    if (stored == at::kHalf) {
      return Choice{"fp16-true", no_bf16 + "; " + stored_text +
                                     ": fp16 compute with f32 masters and loss scaling"};
    }
    return Choice{"fp16-mixed", no_bf16 + ": fp16 autocast with dynamic loss scaling"};
  }
  if (d.cuda) return Choice{"fp32", device + " computes neither bf16 nor fp16 with this LibTorch"};
  return Choice{"fp32",
                device +
                    " has no bf16 hardware (avx512_bf16 or amx_bf16), so bf16 would "
                    "run slower than f32 here" +
                    (stored ? "; the " + Dt(*stored) + " weights are cast to f32" : std::string())};
}

class AutoPolicy : public PrecisionPolicy {
 public:
  explicit AutoPolicy(proto::PrecisionOptions options) : options_(std::move(options)) {}

  StatusOr<PrecisionPlan> MakePlan(const PrecisionRequest& request,
                                   OptionErrors* field_errors) const override {
    ENGINE_ASSIGN_OR_RETURN(Choice choice, Choose(request, options_));
    ENGINE_ASSIGN_OR_RETURN(
        PrecisionPlan plan,
        BuildPolicyPlan(request, options_, *StandardPolicy(choice.policy), "auto", field_errors));
    plan.reason = "auto: " + choice.why + "; " + plan.reason;
    return plan;
  }

 private:
  proto::PrecisionOptions options_;
};

class AutoPolicyPlugin : public PrecisionPolicyPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return proto::PrecisionOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& options,
                       OptionErrors* errors) const override {
    ValidatePrecisionOptions(OptionsAs<proto::PrecisionOptions>(options), nullptr, errors);
  }

  StatusOr<std::unique_ptr<PrecisionPolicy>> Create(
      const google::protobuf::Message& options) const override {
    return std::unique_ptr<PrecisionPolicy>(
        new AutoPolicy(OptionsAs<proto::PrecisionOptions>(options)));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("auto", ENGINE_KIND_PRECISION_POLICY, "0.1.0",
              "chooses the precision policy from the census, the device and the options",
              engine::plugins::AutoPolicyPlugin)
