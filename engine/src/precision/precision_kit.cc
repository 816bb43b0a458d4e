#include "engine/precision_kit.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/glob.h"
#include "engine/dtype.h"
#include "engine/format.h"
#include "precision/device_capability.h"

namespace engine {
namespace {

std::string DtypeText(at::ScalarType t) { return std::string(DtypeShortName(t)); }

std::optional<at::ScalarType> ParseComputeDtype(const std::string& name) {
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16" || name == "f16") return at::kHalf;
  if (name == "fp32" || name == "f32") return at::kFloat;
  return std::nullopt;
}

const ComputeDeclaration* DeclarationFor(const std::vector<ComputeDeclaration>& declared,
                                         const std::string& name) {
  for (const ComputeDeclaration& d : declared) {
    if (GlobMatch(d.pattern, name)) return &d;
  }
  return nullptr;
}

}  // namespace

std::optional<PolicySpec> StandardPolicy(std::string_view name) {
  if (name == "fp32") return PolicySpec{"fp32", at::kFloat, false, false};
  if (name == "bf16-mixed") return PolicySpec{"bf16-mixed", at::kBFloat16, false, false};
  if (name == "fp16-mixed") return PolicySpec{"fp16-mixed", at::kHalf, false, true};
  if (name == "bf16-true") return PolicySpec{"bf16-true", at::kBFloat16, true, false};
  if (name == "fp16-true") return PolicySpec{"fp16-true", at::kHalf, true, true};
  return std::nullopt;
}

void ValidatePrecisionOptions(const proto::PrecisionOptions& options, const PolicySpec* spec,
                              OptionErrors* errors) {
  for (int i = 0; i < options.keep_fp32_size(); ++i) {
    std::string problem = GlobSyntaxError(options.keep_fp32(i));
    if (!problem.empty()) {
      errors->Add("keep_fp32[" + std::to_string(i) + "]",
                  "pattern '" + options.keep_fp32(i) + "': " + problem);
    }
  }
  if (options.has_compute_dtype()) {
    auto dtype = ParseComputeDtype(options.compute_dtype());
    if (!dtype) {
      errors->Add("compute_dtype", "'" + options.compute_dtype() +
                                       "' is not a compute dtype; use bf16, fp16 or fp32");
    } else if (spec != nullptr && *dtype != spec->compute) {
      errors->Add("compute_dtype", spec->policy + " computes in " + DtypeText(spec->compute) +
                                       ", not " + DtypeText(*dtype) +
                                       "; name the policy for that dtype, or use auto with "
                                       "compute_dtype to pin it");
    }
  }
  if (options.has_loss_scaling()) {
    const auto& ls = options.loss_scaling();
    if (spec != nullptr && !spec->loss_scaling) {
      errors->Add("loss_scaling",
                  spec->policy + " does not scale the loss" +
                      (spec->compute == at::kBFloat16
                           ? std::string(": bf16 has f32's range, so gradients cannot underflow "
                                         "the way fp16's do; remove loss_scaling")
                           : std::string("; remove loss_scaling")));
    }
    if (!(ls.initial_scale() >= 1)) {
      errors->Add("loss_scaling.initial_scale",
                  "must be >= 1 (got " + FormatNumber(ls.initial_scale()) + ")");
    }
    if (!(ls.growth_factor() > 1)) {
      errors->Add("loss_scaling.growth_factor",
                  "must be > 1 (got " + FormatNumber(ls.growth_factor()) + ")");
    }
    if (!(ls.backoff_factor() > 0 && ls.backoff_factor() < 1)) {
      errors->Add("loss_scaling.backoff_factor",
                  "must be in (0, 1) (got " + FormatNumber(ls.backoff_factor()) + ")");
    }
    if (ls.growth_interval() == 0) errors->Add("loss_scaling.growth_interval", "must be > 0");
  }
  if (options.unsafe_low_precision_updates() && spec != nullptr && !spec->low_storage) {
    errors->Add("unsafe_low_precision_updates",
                spec->policy +
                    " stores weights in f32 already, so there is nothing to update in low "
                    "precision; it applies to bf16-true and fp16-true");
  }
}

std::optional<at::ScalarType> DominantLowPrecision(const ParameterCensus& census) {
  std::map<at::ScalarType, int64_t> bytes;
  int64_t floating = 0;
  for (const TensorCensusEntry& t : census) {
    if (t.is_buffer || !at::isFloatingType(t.dtype)) continue;
    bytes[t.dtype] += t.bytes();
    floating += t.bytes();
  }
  for (at::ScalarType low : {at::kBFloat16, at::kHalf}) {
    if (floating > 0 && bytes[low] * 2 > floating) return low;
  }
  return std::nullopt;
}

Status CheckDeviceSupports(const PolicySpec& spec, const DeviceCapability& device) {
  if (spec.compute == at::kBFloat16 && !(device.bf16 && device.bf16_autocast)) {
    std::string why = device.cuda
                          ? "it has no bf16 arithmetic (bf16 needs CUDA compute capability 8.0, "
                            "sm_80, or newer)"
                          : std::string("this LibTorch (") + compat::kTorchVersion +
                                ") cannot compute or autocast in bf16 on it";
    return FailedPreconditionError(spec.policy + " computes in bf16, but " + device.Describe() +
                                   " cannot: " + why +
                                   ". Use precision auto (it chooses what this device runs), or " +
                                   (device.fp16 && device.fp16_autocast ? "fp16-mixed" : "fp32"));
  }
  if (spec.compute == at::kHalf && !(device.fp16 && device.fp16_autocast)) {
    std::string why = device.cuda
                          ? "it has no fp16 arithmetic"
                          : std::string("this LibTorch (") + compat::kTorchVersion +
                                ") cannot run fp16 matrix products or fp16 autocast on the CPU";
    return FailedPreconditionError(spec.policy + " computes in fp16, but " + device.Describe() +
                                   " cannot: " + why + ". Use precision auto, or " +
                                   (device.bf16 && device.bf16_autocast ? "bf16-mixed" : "fp32"));
  }
  return Status::Ok();
}

Status CheckCensusAllows(const PolicySpec& spec, const ParameterCensus& census) {
  if (spec.compute != at::kHalf) return Status::Ok();
  if (DominantLowPrecision(census) != at::kBFloat16) return Status::Ok();
  int64_t bf16_tensors = 0, bf16_elements = 0, floating = 0;
  for (const TensorCensusEntry& t : census) {
    if (t.is_buffer || !at::isFloatingType(t.dtype)) continue;
    ++floating;
    if (t.dtype == at::kBFloat16) {
      ++bf16_tensors;
      bf16_elements += t.numel;
    }
  }
  return FailedPreconditionError(
      spec.policy + " computes in fp16, but the model is stored in bf16 (census: " +
      std::to_string(bf16_tensors) + " of " + std::to_string(floating) +
      " floating-point parameter tensors, " + WithThousands(bf16_elements) +
      " values). A model trained in bf16 may rely on bf16's range, which fp16 cannot hold (fp16's "
      "largest value is 65,504; bf16's is about 3.4e38), so activations can overflow to inf. Use "
      "precision auto, bf16-mixed or bf16-true, or fp32");
}

namespace {

// One tensor's storage, compute, gradient, master and optimizer-state dtypes under `spec`.
TensorPlan PlanTensor(const TensorCensusEntry& t, const PrecisionRequest& request,
                      const proto::PrecisionOptions& options, const PolicySpec& spec, bool unsafe,
                      std::vector<int>* keep_hits) {
  TensorPlan tp;
  tp.name = t.name;
  tp.numel = t.numel;
  tp.trainable = t.trainable;
  tp.is_buffer = t.is_buffer;
  if (!at::isFloatingType(t.dtype)) {
    tp.storage = tp.compute = t.dtype;  // integer buffers and indices keep their dtype
    return tp;
  }
  const ComputeDeclaration* declared = DeclarationFor(request.declared_compute, t.name);
  for (int i = 0; i < options.keep_fp32_size(); ++i) {
    if (GlobMatch(options.keep_fp32(i), t.name)) {
      tp.kept_fp32 = true;
      ++(*keep_hits)[static_cast<size_t>(i)];
    }
  }
  if (declared != nullptr && declared->dtype == at::kFloat) tp.kept_fp32 = true;
  tp.storage = tp.kept_fp32 ? at::kFloat : (spec.low_storage ? spec.compute : at::kFloat);
  tp.compute = declared != nullptr ? declared->dtype : spec.compute;
  if (t.trainable) {
    tp.grad = tp.storage;
    tp.master = (tp.storage != at::kFloat && !unsafe) ? at::kFloat : tp.storage;
    tp.optimizer_state = tp.master;
  }
  return tp;
}

// Every keep_fp32 pattern must select something: a typo would silently keep nothing in f32.
void CheckKeepPatternsMatched(const proto::PrecisionOptions& options,
                              const std::vector<int>& keep_hits, OptionErrors* field_errors) {
  for (int i = 0; i < options.keep_fp32_size(); ++i) {
    if (keep_hits[static_cast<size_t>(i)] == 0) {
      field_errors->Add("keep_fp32[" + std::to_string(i) + "]",
                        "pattern '" + options.keep_fp32(i) + "' matches no parameter or buffer");
    }
  }
}

// "casts 3 tensor(s) f32 to bf16, ..." or "no tensor changes dtype".
std::string CastsReason(const std::vector<TensorCensusEntry>& census,
                        const std::vector<TensorPlan>& tensors) {
  std::map<std::string, int64_t> casts;  // "f32 to bf16" -> tensors
  for (size_t i = 0; i < census.size(); ++i) {
    if (tensors[i].storage != census[i].dtype)
      ++casts[DtypeText(census[i].dtype) + " to " + DtypeText(tensors[i].storage)];
  }
  if (casts.empty()) return "no tensor changes dtype";
  std::string reason = "casts";
  bool first = true;
  for (const auto& [what, n] : casts) {
    reason += (first ? " " : ", ") + std::to_string(n) + " tensor(s) " + what;
    first = false;
  }
  return reason;
}

void AddPlanWarnings(const PrecisionRequest& request, const PolicySpec& spec, PrecisionPlan* plan) {
  int64_t unsafe_tensors = 0;
  for (const TensorPlan& tp : plan->tensors) {
    if (tp.trainable && at::isFloatingType(tp.storage) && tp.master != at::kFloat) ++unsafe_tensors;
  }
  if (unsafe_tensors > 0) {
    plan->warnings.push_back(
        "unsafe_low_precision_updates: " + std::to_string(unsafe_tensors) +
        " trainable tensor(s) are updated in " + DtypeText(spec.compute) +
        " without f32 masters or f32 optimizer state; an update smaller than " +
        (spec.compute == at::kBFloat16 ? std::string("1/256") : std::string("1/2048")) +
        " of a weight is lost to rounding" +
        (spec.loss_scaling ? ", and there is no loss scaling (it needs f32 masters)" : ""));
  }
  if (spec.compute == at::kBFloat16 && !request.device.bf16_fast) {
    plan->warnings.push_back(request.device.Describe() +
                             " has no bf16 hardware; bf16 compute runs, but slower than f32");
  }
  // LibTorch runs fp16 on such a CPU, in software: an MLP's step took 37x fp32's on a 2-core AMD
  // EPYC (bench/precision_bench, 2026-11-29). `auto` never picks fp16 on a CPU.
  if (spec.compute == at::kHalf && !request.device.cuda && !CpuHasFp16Hardware()) {
    plan->warnings.push_back(request.device.Describe() +
                             " has no fp16 hardware (avx512_fp16 or amx_fp16); fp16 compute runs "
                             "in software, tens of times slower than f32. Precision auto picks "
                             "what this CPU computes fast");
  }
}

}  // namespace

StatusOr<PrecisionPlan> BuildPolicyPlan(const PrecisionRequest& request,
                                        const proto::PrecisionOptions& options,
                                        const PolicySpec& spec, const std::string& requested,
                                        OptionErrors* field_errors) {
  // The census first: a bf16 model is no place for fp16 on any device.
  ENGINE_RETURN_IF_ERROR(CheckCensusAllows(spec, request.census));
  ENGINE_RETURN_IF_ERROR(CheckDeviceSupports(spec, request.device));

  PrecisionPlan plan;
  plan.requested = requested;
  plan.policy = spec.policy;
  if (spec.compute != at::kFloat) plan.autocast = spec.compute;
  const bool unsafe = options.unsafe_low_precision_updates() && spec.low_storage;
  plan.unsafe_low_precision_updates = unsafe;
  if (spec.loss_scaling && !unsafe) {
    const auto& ls = options.loss_scaling();
    plan.loss_scaling = {true, ls.initial_scale(), ls.growth_factor(), ls.backoff_factor(),
                         static_cast<int64_t>(ls.growth_interval())};
  }
  std::vector<int> keep_hits(static_cast<size_t>(options.keep_fp32_size()), 0);
  for (const TensorCensusEntry& t : request.census)
    plan.tensors.push_back(PlanTensor(t, request, options, spec, unsafe, &keep_hits));
  CheckKeepPatternsMatched(options, keep_hits, field_errors);
  plan.reason = CastsReason(request.census, plan.tensors);
  AddPlanWarnings(request, spec, &plan);
  GroupTensorPlans(&plan);
  ENGINE_RETURN_IF_ERROR(CheckPlanInvariants(plan, request.device));
  return plan;
}

void GroupTensorPlans(PrecisionPlan* plan) {
  using Key = std::tuple<int, bool, at::ScalarType, at::ScalarType, at::ScalarType, at::ScalarType>;
  std::map<Key, PrecisionGroupPlan> groups;
  std::vector<Key> order;
  for (const TensorPlan& t : plan->tensors) {
    const int role = t.is_buffer ? 2 : (t.trainable ? 0 : 1);
    const Key key{role, t.kept_fp32, t.storage, t.compute, t.grad, t.master};
    auto [it, inserted] = groups.emplace(key, PrecisionGroupPlan());
    PrecisionGroupPlan& g = it->second;
    if (inserted) {
      order.push_back(key);
      g.name = role == 2 ? "buffers" : (role == 0 ? "trainable" : "frozen");
      if (t.kept_fp32) g.name += ", kept f32";
      g.storage = t.storage;
      g.compute = t.compute;
      g.grad = t.grad;
      g.master = t.master;
      g.optimizer_state = t.optimizer_state;
      g.has_grad = t.trainable;
    }
    ++g.num_tensors;
    g.num_elements += t.numel;
    g.bytes += t.numel * static_cast<int64_t>(c10::elementSize(t.storage));
    if (t.trainable && t.master != t.storage) {
      g.bytes += t.numel * static_cast<int64_t>(c10::elementSize(t.master));
    }
  }
  std::sort(order.begin(), order.end());
  plan->groups.clear();
  std::map<std::string, int> name_uses;
  for (const Key& key : order) ++name_uses[groups[key].name];
  for (const Key& key : order) {
    PrecisionGroupPlan g = groups[key];
    if (name_uses[g.name] > 1) g.name += " (" + DtypeText(g.storage) + ")";
    plan->groups.push_back(g);
  }
}

Status CheckPlanInvariants(const PrecisionPlan& plan, const DeviceCapability& device) {
  const std::string where = "precision plan '" + plan.policy + "'";
  for (const TensorPlan& t : plan.tensors) {
    const std::string tensor = where + ", tensor '" + t.name + "'";
    if (t.trainable) {
      if (t.master == at::ScalarType::Undefined || t.grad == at::ScalarType::Undefined) {
        return FailedPreconditionError(tensor +
                                       ": a trainable tensor needs a grad and a master "
                                       "dtype");
      }
      if (t.optimizer_state != t.master) {
        return FailedPreconditionError(
            tensor + ": the optimizer state (" + DtypeText(t.optimizer_state) +
            ") must have the dtype of the weights it updates (" + DtypeText(t.master) +
            "), or the optimizer meets mismatched dtypes (F6)");
      }
      if (plan.loss_scaling.enabled && t.master != at::kFloat) {
        return FailedPreconditionError(
            tensor +
            ": loss scaling needs an f32 master for every trainable tensor (this one's is " +
            DtypeText(t.master) +
            "), or unscaled updates are lost to rounding (F7); drop "
            "unsafe_low_precision_updates or the loss scaling");
      }
    }
    if (t.kept_fp32 && t.storage != at::kFloat) {
      return FailedPreconditionError(tensor + ": it is kept in f32 but stored in " +
                                     DtypeText(t.storage));
    }
  }
  const bool bf16 = plan.autocast == at::kBFloat16;
  if (bf16 && plan.loss_scaling.enabled) {
    return FailedPreconditionError(where + ": bf16 never uses loss scaling (it has f32's range)");
  }
  if (plan.autocast) {
    PolicySpec spec{plan.policy, *plan.autocast, false, false};
    ENGINE_RETURN_IF_ERROR(CheckDeviceSupports(spec, device));
  }
  return Status::Ok();
}

}  // namespace engine
