#include "train/optimizer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>
#include <map>

#include "engine_kernels/fused_adamw.h"

namespace engine {

GradientFeed GradientOf(const at::Tensor& parameter, size_t i,
                        const std::vector<GradientFeed>& feeds) {
  if (i < feeds.size() && feeds[i].grad.defined()) {
    return {feeds[i].grad, feeds[i].scale, feeds[i].write_back};
  }
  return {parameter.grad(), 1.0, at::Tensor()};
}

Status Optimizer::LoadStatePieces(const TensorPieces& state, int64_t steps) {
  safetensors::NamedTensors whole;
  for (const std::string& name : state.names()) {
    ENGINE_ASSIGN_OR_RETURN(at::Tensor tensor, state.Whole(name));
    whole.emplace_back(name, std::move(tensor));
  }
  return LoadState(whole, steps);
}

namespace {

// Shared state bookkeeping: named slots per parameter, created on first use.
class SlotOptimizer : public Optimizer {
 public:
  SlotOptimizer(std::vector<NamedParameter> parameters, std::vector<std::string> slot_names)
      : parameters_(std::move(parameters)), slot_names_(std::move(slot_names)) {
    slots_.resize(parameters_.size());
  }

  std::vector<std::string> slot_names() const override { return slot_names_; }

  safetensors::NamedTensors State() const override {
    safetensors::NamedTensors out;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      for (size_t s = 0; s < slots_[i].size(); ++s) {
        out.emplace_back(parameters_[i].name + "." + slot_names_[s], slots_[i][s]);
      }
    }
    return out;
  }

  Status LoadState(const safetensors::NamedTensors& state, int64_t steps) override {
    std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
    std::vector<std::vector<at::Tensor>> loaded(parameters_.size());
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const at::Tensor& p = parameters_[i].tensor;
      for (const std::string& slot : slot_names_) {
        auto it = by_name.find(parameters_[i].name + "." + slot);
        if (it == by_name.end()) {
          if (!loaded[i].empty()) {
            return DataLossError("optimizer state for '" + parameters_[i].name + "' lacks '" +
                                 slot + "'");
          }
          break;  // this parameter never had a gradient
        }
        if (!it->second.sizes().equals(p.sizes())) {
          return DataLossError("optimizer state '" + it->first + "' has the wrong shape");
        }
        loaded[i].push_back(it->second.to(p.device(), p.scalar_type()).clone());
        by_name.erase(it);
      }
    }
    if (!by_name.empty()) {
      return DataLossError("optimizer state holds '" + by_name.begin()->first +
                           "', which matches no trainable parameter");
    }
    slots_ = std::move(loaded);
    steps_ = steps;
    return Status::Ok();
  }

 protected:
  std::vector<at::Tensor>& SlotsFor(size_t i) {
    if (slots_[i].empty()) {
      for (size_t s = 0; s < slot_names_.size(); ++s) {
        slots_[i].push_back(at::zeros_like(parameters_[i].tensor));
      }
    }
    return slots_[i];
  }

  std::vector<NamedParameter> parameters_;
  std::vector<std::string> slot_names_;
  std::vector<std::vector<at::Tensor>> slots_;
};

// The gradient in the parameter's dtype with the factor applied (a new tensor when either applies).
at::Tensor Unscaled(const GradientFeed& g, const at::Tensor& parameter) {
  at::Tensor out = g.grad.to(parameter.scalar_type());
  if (g.scale != 1.0) out = out.is_same(g.grad) ? out.mul(g.scale) : out.mul_(g.scale);
  return out;
}

bool FitsFusedCopy(const at::Tensor& write_back, const at::Tensor& parameter) {
  return !write_back.defined() ||
         (write_back.device() == parameter.device() && write_back.is_contiguous() &&
          (write_back.scalar_type() == at::kBFloat16 || write_back.scalar_type() == at::kHalf) &&
          write_back.numel() == parameter.numel());
}

class AdamW : public SlotOptimizer {
 public:
  AdamW(const proto::Optimizer::AdamW& config, std::vector<NamedParameter> parameters)
      : SlotOptimizer(std::move(parameters), {"exp_avg", "exp_avg_sq"}), config_(config) {}

  std::string algorithm() const override { return "adamw"; }

  void Update(double lr, const std::vector<GradientFeed>& feeds) override {
    at::NoGradGuard no_grad;
    ++steps_;
    const double b1 = config_.beta1(), b2 = config_.beta2();
    const double bias1 = 1 - std::pow(b1, static_cast<double>(steps_));
    const double bias2_sqrt = std::sqrt(1 - std::pow(b2, static_cast<double>(steps_)));
    for (size_t i = 0; i < parameters_.size(); ++i) {
      at::Tensor& p = parameters_[i].tensor;
      const GradientFeed step_grad = GradientOf(p, i, feeds);
      if (!step_grad.grad.defined()) continue;
      auto& slots = SlotsFor(i);
      at::Tensor& m = slots[0];
      at::Tensor& v = slots[1];
      if (kernels::FusedAdamWSupports(p, step_grad.grad) && m.is_contiguous() &&
          v.is_contiguous() && m.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
          FitsFusedCopy(step_grad.write_back, p)) {
        // One pass over p, g, m, v (and the low-precision copy) instead of a cast, a scale, six
        // kernels and a copy (kernels/fused_adamw.h).
        kernels::AdamWHyper hyper;
        hyper.lr = lr;
        hyper.beta1 = b1;
        hyper.beta2 = b2;
        hyper.epsilon = config_.epsilon();
        hyper.weight_decay = config_.weight_decay();
        hyper.step = steps_;
        kernels::FusedAdamW(p, step_grad.grad, m, v, hyper, step_grad.scale, step_grad.write_back);
        continue;
      }
      const at::Tensor g = Unscaled(step_grad, p);
      if (config_.weight_decay() != 0) p.mul_(1 - lr * config_.weight_decay());
      m.mul_(b1).add_(g, 1 - b1);
      v.mul_(b2).addcmul_(g, g, 1 - b2);
      at::Tensor denom = v.sqrt().div_(bias2_sqrt).add_(config_.epsilon());
      p.addcdiv_(m, denom, -lr / bias1);
      if (step_grad.write_back.defined()) step_grad.write_back.copy_(p);
    }
  }

 private:
  proto::Optimizer::AdamW config_;
};

class Sgd : public SlotOptimizer {
 public:
  Sgd(const proto::Optimizer::Sgd& config, std::vector<NamedParameter> parameters)
      : SlotOptimizer(std::move(parameters), config.momentum() > 0
                                                 ? std::vector<std::string>{"momentum_buffer"}
                                                 : std::vector<std::string>{}),
        config_(config) {}

  std::string algorithm() const override { return "sgd"; }

  void Update(double lr, const std::vector<GradientFeed>& feeds) override {
    at::NoGradGuard no_grad;
    ++steps_;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      at::Tensor& p = parameters_[i].tensor;
      const GradientFeed step_grad = GradientOf(p, i, feeds);
      if (!step_grad.grad.defined()) continue;
      at::Tensor g = Unscaled(step_grad, p);
      if (config_.weight_decay() != 0) g = g.add(p, config_.weight_decay());
      if (config_.momentum() > 0) {
        const bool first = slots_[i].empty();
        at::Tensor& buffer = SlotsFor(i)[0];
        if (first) {
          buffer.copy_(g);
        } else {
          buffer.mul_(config_.momentum()).add_(g);
        }
        g = config_.nesterov() ? g.add(buffer, config_.momentum()) : buffer;
      }
      p.add_(g, -lr);
      if (step_grad.write_back.defined()) step_grad.write_back.copy_(p);
    }
  }

 private:
  proto::Optimizer::Sgd config_;
};

}  // namespace

std::unique_ptr<Optimizer> MakeOptimizer(const proto::Optimizer& config,
                                         std::vector<NamedParameter> parameters) {
  if (config.has_sgd()) return std::make_unique<Sgd>(config.sgd(), std::move(parameters));
  return std::make_unique<AdamW>(config.adamw(), std::move(parameters));
}

}  // namespace engine
