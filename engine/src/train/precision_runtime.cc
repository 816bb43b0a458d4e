#include "train/precision_runtime.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/module.h>

#include <cmath>
#include <map>
#include <vector>

#include "core/module_tensors.h"
#include "engine/dtype.h"
#include "engine_kernels/fused_adamw.h"
#include "precision/census.h"

namespace engine {

namespace {

// The plan's entry for each tensor, by name.
class TensorPlans {
 public:
  explicit TensorPlans(const PrecisionPlan& plan) {
    for (const TensorPlan& t : plan.tensors) by_name_[t.name] = &t;
  }
  StatusOr<const TensorPlan*> Find(const std::string& name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
      return InternalError("the precision plan has no entry for tensor '" + name + "'");
    }
    return it->second;
  }

 private:
  std::map<std::string, const TensorPlan*> by_name_;
};

}  // namespace

Status PrecisionRuntime::CastStorage(const PrecisionPlan& plan, torch::nn::Module& module) {
  const TensorPlans plans(plan);
  at::NoGradGuard no_grad;
  for (ModuleTensor& item : ModuleTensors(module)) {
    ENGINE_ASSIGN_OR_RETURN(const TensorPlan* t, plans.Find(item.name));
    if (item.tensor.scalar_type() != t->storage) item.tensor.set_data(item.tensor.to(t->storage));
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<PrecisionRuntime>> PrecisionRuntime::Apply(const PrecisionPlan& plan,
                                                                    torch::nn::Module& module,
                                                                    c10::Device device,
                                                                    MasterHolder masters) {
  const TensorPlans plans(plan);
  ENGINE_RETURN_IF_ERROR(CastStorage(plan, module));
  // The census after the casts must be the plan.
  for (const TensorCensusEntry& e : TakeCensus(module)) {
    ENGINE_ASSIGN_OR_RETURN(const TensorPlan* t, plans.Find(e.name));
    if (e.dtype != t->storage) {
      return InternalError("tensor '" + e.name + "' is " + std::string(DtypeShortName(e.dtype)) +
                           " after applying the precision plan, which says " +
                           std::string(DtypeShortName(t->storage)));
    }
  }

  std::unique_ptr<PrecisionRuntime> runtime(new PrecisionRuntime());
  runtime->master_holder_ = masters;
  if (plan.autocast) runtime->context_ = PrecisionContext::Autocast(device.type(), *plan.autocast);
  runtime->loss_scaling_ = plan.loss_scaling;
  runtime->scale_ = plan.loss_scaling.enabled ? plan.loss_scaling.initial_scale : 1.0;
  at::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    ENGINE_ASSIGN_OR_RETURN(const TensorPlan* t, plans.Find(item.key()));
    if (!t->trainable) {
      return InternalError("tensor '" + item.key() +
                           "' trains, but the precision plan has it frozen");
    }
    runtime->parameters_.push_back({item.key(), item.value()});
    const bool master = t->master != t->storage;
    runtime->master_dtypes_.push_back(master ? t->master : at::ScalarType::Undefined);
    if (master && masters == MasterHolder::kRuntime) {
      at::Tensor copy = item.value().detach().to(t->master).clone();
      copy.set_requires_grad(true);
      runtime->optimizer_parameters_.push_back({item.key(), copy});
    } else {
      runtime->optimizer_parameters_.push_back({item.key(), item.value()});
    }
    runtime->holders_.push_back(item.value());
    runtime->holder_parameter_.push_back(runtime->parameters_.size() - 1);
  }
  return runtime;
}

Status PrecisionRuntime::HoldGradientsIn(std::vector<at::Tensor> parts,
                                         std::vector<size_t> parameter_of) {
  if (master_holder_ != MasterHolder::kOptimizer || parts.size() != parameter_of.size()) {
    return InternalError("gradients held in parts need masters held by the optimizer");
  }
  for (size_t i : parameter_of) {
    if (i >= parameters_.size()) return InternalError("a gradient part of no parameter");
  }
  holders_ = std::move(parts);
  holder_parameter_ = std::move(parameter_of);
  return Status::Ok();
}

std::vector<at::ScalarType> PrecisionRuntime::OptimizerMasterDtypes() const {
  if (master_holder_ == MasterHolder::kOptimizer) return master_dtypes_;
  return std::vector<at::ScalarType>(parameters_.size(), at::ScalarType::Undefined);
}

void PrecisionRuntime::ZeroGrad() {
  feeds_.clear();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (parameters_[i].tensor.grad().defined()) parameters_[i].tensor.mutable_grad().reset();
    if (KeepsMaster(i) && optimizer_parameters_[i].tensor.grad().defined()) {
      optimizer_parameters_[i].tensor.mutable_grad().reset();
    }
  }
  for (const at::Tensor& holder : holders_) {
    if (holder.grad().defined()) holder.mutable_grad().reset();
  }
}

at::Tensor PrecisionRuntime::UnscaleAndFlag() {
  at::NoGradGuard no_grad;
  const double factor = 1.0 / scale_;
  feeds_.assign(holders_.size(), GradientFeed());
  at::Tensor found;  // one int32 on the gradients' device that the kernels set on inf or nan
  at::Tensor total;  // where no kernel takes a gradient: an f32 sum each, any inf or nan shows
  for (size_t h = 0; h < holders_.size(); ++h) {
    at::Tensor grad = holders_[h].grad();
    if (!grad.defined()) continue;
    // A master's gradient is unscaled into f32 by the optimizer (see the header).
    const bool master = HasMaster(holder_parameter_[h]);
    const bool unscale_here = !master && factor != 1.0;
    if (master) feeds_[h] = {grad, factor, holders_[h]};
    const bool kernel = kernels::FusedKernelsTake(grad);
    if (kernel && !found.defined()) found = at::zeros({1}, grad.options().dtype(at::kInt));
    if (kernel && grad.device() == found.device()) {
      if (unscale_here) {
        kernels::UnscaleAndFlagNonFinite(grad, factor, found);
      } else {
        kernels::FlagNonFinite(grad, found);
      }
      continue;
    }
    if (unscale_here) grad.mul_(factor);
    at::Tensor sum = grad.sum(at::kFloat);
    total = total.defined() ? total + sum : sum;
  }
  // found counts flagged gradients; total - total is 0 when the sums are finite, else nan.
  at::Tensor flag;
  if (found.defined()) flag = found.to(at::kFloat).sum();
  if (total.defined()) flag = flag.defined() ? flag + (total - total) : total - total;
  return flag.defined() ? flag : at::zeros({}, at::kFloat);
}

bool PrecisionRuntime::UnscaleAndCheck() { return UnscaleAndFlag().item<double>() == 0; }

at::Tensor PrecisionRuntime::GradNormSquared() const {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (size_t h = 0; h < holders_.size(); ++h) {
    if (Fed(h)) {
      norms.push_back(at::norm(feeds_[h].grad, 2, at::kFloat) * feeds_[h].scale);
    } else if (const at::Tensor& g = holders_[h].grad();
               g.defined() && !HasMaster(holder_parameter_[h])) {
      norms.push_back(at::norm(g, 2, at::kFloat));
    }
  }
  if (norms.empty()) return at::zeros({}, at::kFloat);
  const at::Device device = norms.front().device();
  for (at::Tensor& n : norms) n = n.to(device);
  return at::stack(norms).to(at::kDouble).square().sum();
}

double PrecisionRuntime::ClipGradients(double max_norm, double divisor) {
  const double total = std::sqrt(GradNormSquared().item<double>()) / divisor;
  ApplyClip(total, max_norm, divisor);
  return total;
}

void PrecisionRuntime::ApplyClip(double total_norm, double max_norm, double divisor) {
  at::NoGradGuard no_grad;
  const bool clips = max_norm > 0 && std::isfinite(total_norm) && total_norm > max_norm;
  const double factor = (clips ? max_norm / (total_norm + 1e-6) : 1.0) / divisor;
  if (factor == 1.0) return;
  for (size_t h = 0; h < holders_.size(); ++h) {
    if (Fed(h)) {
      feeds_[h].scale *= factor;
    } else if (at::Tensor g = holders_[h].grad(); g.defined() && !HasMaster(holder_parameter_[h])) {
      g.mul_(factor);
    }
  }
}

void PrecisionRuntime::Step(Optimizer& optimizer, double lr) {
  optimizer.Step(lr, feeds_);
  at::NoGradGuard no_grad;
  // (The runtime keeps masters only with the parameters as the holders: i is also the holder.)
  for (size_t i = 0; i < parameters_.size(); ++i) {
    // A fed gradient's update was written back by the optimizer; a master without a gradient
    // did not change.
    if (KeepsMaster(i) && !Fed(i) && optimizer_parameters_[i].tensor.grad().defined()) {
      parameters_[i].tensor.copy_(optimizer_parameters_[i].tensor);
    }
  }
  feeds_.clear();
}

void PrecisionRuntime::SyncParameters() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (KeepsMaster(i)) parameters_[i].tensor.copy_(optimizer_parameters_[i].tensor);
  }
}

void PrecisionRuntime::UpdateScale(bool found_inf) {
  if (found_inf) {
    ++skipped_steps_;
    ++consecutive_skips_;
  } else {
    consecutive_skips_ = 0;
  }
  if (!loss_scaling_.enabled) return;
  if (found_inf) {
    scale_ *= loss_scaling_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ >= loss_scaling_.growth_interval) {
    scale_ *= loss_scaling_.growth_factor;
    growth_tracker_ = 0;
  }
}

Status PrecisionRuntime::VerifyOptimizerState(const Optimizer& optimizer) const {
  // The dtype of the weights the optimizer updates: the masters it keeps, where it keeps them.
  const std::vector<at::ScalarType> kept = OptimizerMasterDtypes();
  std::map<std::string, std::pair<const at::Tensor*, at::ScalarType>> updated;
  for (size_t i = 0; i < optimizer_parameters_.size(); ++i) {
    const at::Tensor& p = optimizer_parameters_[i].tensor;
    updated[optimizer_parameters_[i].name] = {
        &p, kept[i] != at::ScalarType::Undefined ? kept[i] : p.scalar_type()};
  }
  for (const auto& [name, state] : optimizer.State()) {
    const size_t dot = name.rfind('.');
    auto it = updated.find(name.substr(0, dot == std::string::npos ? 0 : dot));
    if (it == updated.end()) {
      return FailedPreconditionError("optimizer state '" + name +
                                     "' belongs to no tensor the optimizer updates");
    }
    const auto [weights, dtype] = it->second;
    if (state.scalar_type() != dtype || !state.sizes().equals(weights->sizes())) {
      return FailedPreconditionError(
          "optimizer state '" + name + "' is " + std::string(DtypeShortName(state.scalar_type())) +
          " but the weights it updates are " + std::string(DtypeShortName(dtype)) +
          " (or of another shape); the optimizer would meet mismatched dtypes (F6)");
    }
  }
  return Status::Ok();
}

safetensors::NamedTensors PrecisionRuntime::MasterTensors() const {
  safetensors::NamedTensors out;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (KeepsMaster(i)) {
      out.emplace_back(parameters_[i].name + ".master", optimizer_parameters_[i].tensor.detach());
    }
  }
  return out;
}

PrecisionRuntime::ScalerState PrecisionRuntime::scaler_state() const {
  return {scale_, growth_tracker_, skipped_steps_, consecutive_skips_};
}

Status PrecisionRuntime::Restore(const safetensors::NamedTensors& masters,
                                 const ScalerState& scaler) {
  std::map<std::string, at::Tensor> by_name(masters.begin(), masters.end());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!KeepsMaster(i)) continue;
    const std::string name = parameters_[i].name + ".master";
    auto it = by_name.find(name);
    at::Tensor& master = optimizer_parameters_[i].tensor;
    if (it == by_name.end()) return DataLossError("the f32 master '" + name + "' is missing");
    if (it->second.scalar_type() != master.scalar_type() ||
        !it->second.sizes().equals(master.sizes())) {
      return DataLossError("the master '" + name +
                           "' has another dtype or shape than this stage's");
    }
    master.copy_(it->second);
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    return DataLossError(
        "'" + by_name.begin()->first +
        (master_holder_ == MasterHolder::kOptimizer
             ? "' is for the optimizer, which keeps this stage's masters (a bug: it was not "
               "handed to the optimizer)"
             : "' is the master of no tensor this stage trains in low precision"));
  }
  scale_ = scaler.scale;
  growth_tracker_ = scaler.growth_tracker;
  skipped_steps_ = scaler.skipped_steps;
  consecutive_skips_ = scaler.consecutive_skipped_steps;
  return Status::Ok();
}

}  // namespace engine
