// The shared body of the built-in precision policies: options are engine.proto.PrecisionOptions,
// validation and plans come from engine/precision_kit.h. Each policy is its own plugin library;
// this header is compiled into each.
#pragma once

#include <memory>
#include <string>

#include "engine/precision.h"
#include "engine/precision_kit.h"

namespace engine::plugins {

// A fixed policy: `fp32`, `bf16-mixed`, `fp16-mixed`, `bf16-true` or `fp16-true`.
class FixedPolicy : public PrecisionPolicy {
 public:
  FixedPolicy(PolicySpec spec, proto::PrecisionOptions options)
      : spec_(std::move(spec)), options_(std::move(options)) {}

  StatusOr<PrecisionPlan> MakePlan(const PrecisionRequest& request,
                                   OptionErrors* field_errors) const override {
    ENGINE_ASSIGN_OR_RETURN(PrecisionPlan plan,
                            BuildPolicyPlan(request, options_, spec_, spec_.policy, field_errors));
    plan.reason = "as the pipeline asks; " + plan.reason;
    return plan;
  }

 private:
  PolicySpec spec_;
  proto::PrecisionOptions options_;
};

class StandardPolicyPlugin : public PrecisionPolicyPlugin {
 public:
  explicit StandardPolicyPlugin(const std::string& name) : spec_(*engine::StandardPolicy(name)) {}

  const google::protobuf::Message& default_options() const override {
    return proto::PrecisionOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& options,
                       OptionErrors* errors) const override {
    ValidatePrecisionOptions(OptionsAs<proto::PrecisionOptions>(options), &spec_, errors);
  }

  StatusOr<std::unique_ptr<PrecisionPolicy>> Create(
      const google::protobuf::Message& options) const override {
    return std::unique_ptr<PrecisionPolicy>(
        new FixedPolicy(spec_, OptionsAs<proto::PrecisionOptions>(options)));
  }

 private:
  PolicySpec spec_;
};

}  // namespace engine::plugins

// Defines CLASS, the plugin of the standard policy POLICY, and the library's entry points.
#define ENGINE_STANDARD_PRECISION_POLICY(POLICY, CLASS, DESCRIPTION) \
  namespace {                                                        \
  class CLASS : public engine::plugins::StandardPolicyPlugin {       \
   public:                                                           \
    CLASS() : StandardPolicyPlugin(POLICY) {}                        \
  };                                                                 \
  }                                                                  \
  ENGINE_PLUGIN(POLICY, ENGINE_KIND_PRECISION_POLICY, "0.1.0", DESCRIPTION, CLASS)
