#include "engine/activation_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>
#include <vector>

#include "core/block_runner.h"
#include "engine/precision_context.h"

namespace engine {
namespace {

// What the recomputation needs besides the input: the block, the precision context and the
// random state of the first run, and what to do around each run (may be empty).
struct Recompute : torch::CustomClassHolder {
  std::function<at::Tensor(const at::Tensor&)> block;
  PrecisionContext context;
  // The generators the block may draw from (the CPU's, and the input's device's) and their states
  // when the first run began.
  std::vector<std::pair<at::Generator, at::Tensor>> rng_states;
  std::function<void()> acquire;
  std::function<void()> release;
};

// Sets each generator to its state in `states` and returns the states they had.
std::vector<std::pair<at::Generator, at::Tensor>> SwapRngStates(
    const std::vector<std::pair<at::Generator, at::Tensor>>& states) {
  std::vector<std::pair<at::Generator, at::Tensor>> before;
  for (const auto& [generator, state] : states) {
    at::Generator g = generator;
    std::lock_guard<std::mutex> lock(g.mutex());
    before.emplace_back(g, g.get_state());
    g.set_state(state);
  }
  return before;
}

// The CPU's generator and, for an input on another device, that device's, with their states now.
std::vector<std::pair<at::Generator, at::Tensor>> CurrentRngStates(const at::Tensor& input) {
  std::vector<at::Generator> generators = {at::detail::getDefaultCPUGenerator()};
  if (input.defined() && !input.device().is_cpu() && !input.device().is_meta()) {
    generators.push_back(at::globalContext().defaultGenerator(input.device()));
  }
  std::vector<std::pair<at::Generator, at::Tensor>> states;
  for (at::Generator& g : generators) {
    std::lock_guard<std::mutex> lock(g.mutex());
    states.emplace_back(g, g.get_state());
  }
  return states;
}

// Calls `acquire` now and `release` when it goes out of scope, also when the block throws.
class AroundRun {
 public:
  explicit AroundRun(const Recompute& recompute) : release_(recompute.release) {
    if (recompute.acquire) recompute.acquire();
  }
  ~AroundRun() {
    if (release_) release_();
  }
  AroundRun(const AroundRun&) = delete;
  AroundRun& operator=(const AroundRun&) = delete;

 private:
  const std::function<void()>& release_;
};

// Autocast caches the low-precision copy of each f32 parameter it casts until the outermost
// autocast scope ends. A copy made in the first, gradient-free run has no history: reused in the
// recomputation, it would cut those parameters (the biases of at::linear, say) off from their
// gradients. The first run therefore caches nothing.
class AutocastCacheOff {
 public:
  AutocastCacheOff() : was_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(was_); }
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool was_;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // `anchor` requires grad, so the backward node exists even when `input` needs no gradient (the
  // block's parameters still do).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& /*anchor*/, c10::intrusive_ptr<Recompute> recompute) {
    ctx->save_for_backward({input});
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    auto scope = recompute->context.Enter();
    AutocastCacheOff no_cache;
    AroundRun around(*recompute);
    return recompute->block(input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto recompute =
        c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const at::Tensor saved = ctx->get_saved_variables()[0];
    at::Tensor input = saved.detach().set_requires_grad(saved.requires_grad());
    const auto current_states = SwapRngStates(recompute->rng_states);
    AroundRun around(*recompute);
    at::Tensor output;
    {
      at::AutoGradMode enable(true);
      auto scope = recompute->context.Enter();
      output = recompute->block(input);
    }
    SwapRngStates(current_states);
    torch::autograd::backward({output}, {grads[0]});
    return {input.requires_grad() ? input.grad() : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor CheckpointedForward(const std::function<at::Tensor(const at::Tensor&)>& block,
                               const at::Tensor& input) {
  return CheckpointedForwardAround(block, input, {}, {});
}

at::Tensor CheckpointedForwardAround(const std::function<at::Tensor(const at::Tensor&)>& block,
                                     const at::Tensor& input, const std::function<void()>& acquire,
                                     const std::function<void()>& release) {
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->block = block;
  recompute->acquire = acquire;
  recompute->release = release;
  if (!at::GradMode::is_enabled()) {
    AroundRun around(*recompute);
    return block(input);
  }
  recompute->context = PrecisionContext::Capture();
  recompute->rng_states = CurrentRngStates(input);
  static const at::Tensor anchor = at::empty({0}).set_requires_grad(true);
  return CheckpointFunction::apply(input, anchor, recompute);
}

}  // namespace engine
