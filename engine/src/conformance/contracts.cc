// Each plugin kind's contract: what a data loader, a model loader, a precision policy and a
// callback must do beyond loading and taking options (checks.cc).
#include <ATen/core/grad_mode.h>
#include <ATen/ops/equal.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <thread>

#include "conformance/check_support.h"
#include "conformance/synthetic.h"
#include "core/atomic_file.h"
#include "core/guarded_call.h"
#include "core/module_tensors.h"
#include "core/remove_tree.h"
#include "engine/conformance.h"
#include "engine/dtype.h"
#include "engine/format.h"
#include "engine/model.h"
#include "engine/precision_context.h"
#include "engine/precision_kit.h"
#include "engine/safetensors.h"
#include "precision/census.h"
#include "precision/device_capability.h"
#include "train/optimizer.h"
#include "train/precision_runtime.h"

namespace engine::conformance {
namespace {

using google::protobuf::Message;

safetensors::NamedTensors StateOf(torch::nn::Module& module) {
  safetensors::NamedTensors out;
  for (const ModuleTensor& t : ModuleTensors(module)) out.emplace_back(t.name, t.tensor);
  return out;
}

class NoActions : public CallbackActions {
 public:
  void RequestStop(const std::string&) override {}
  void RequestCheckpoint() override {}
};

}  // namespace

// Long by design: a contract is the checklist a plugin author works through top to bottom, each
// early return one broken promise with its message, in the order the engine relies on them.
CheckResult DataContract(const Subject& s) {
  auto options = UsableOptions(s);
  if (!options.ok()) return Skip(options.status().message());
  const auto& plugin = static_cast<const DataLoaderPlugin&>(*s.loaded.plugin);
  auto open = [&](uint64_t seed) {
    return GuardedCall("Open", [&] {
      return plugin.Open(**options, DataContext{s.base_dir, seed});
    });
  };
  auto first = open(7);
  if (!first.ok())
    return Skip("cannot open the data with these options: " + first.status().message());
  const Dataset& data = **first;
  const DataSpec& spec = data.spec();
  if (spec.fields.empty()) return Fail("the data spec has no field");
  if (data.identity().empty()) return Fail("identity() is empty");
  if (data.description().empty()) return Fail("description() is empty");
  for (Split split : {Split::kTrain, Split::kEval}) {
    const int64_t n = data.size(split);
    if (n < 0) return Fail(std::string(SplitName(split)) + " size is negative");
    if (n == 0) continue;
    std::vector<int64_t> indices;
    for (int64_t i = 0; i < std::min<int64_t>(n, 4); ++i) indices.push_back(i);
    indices.push_back(n - 1);
    auto batch = GuardedCall("GetBatch", [&] { return data.GetBatch(split, indices); });
    if (!batch.ok()) return Fail("GetBatch: " + batch.status().message());
    for (const FieldSpec& field : spec.fields) {
      auto it = batch->find(field.name);
      if (it == batch->end()) {
        return Fail("batches lack field '" + field.name + "' of the spec " + spec.ToString());
      }
      const at::Tensor& t = it->second;
      if (t.scalar_type() != field.dtype) {
        return Fail("field '" + field.name + "' is " +
                    std::string(DtypeShortName(t.scalar_type())) + ", the spec says " +
                    std::string(DtypeShortName(field.dtype)));
      }
      if (t.dim() != static_cast<int64_t>(field.shape.size()) + 1 ||
          t.size(0) != static_cast<int64_t>(indices.size())) {
        return Fail("field '" + field.name + "' has shape " + c10::str(t.sizes()) + " for " +
                    std::to_string(indices.size()) + " examples; the spec says [B]+" +
                    c10::str(field.shape));
      }
      for (size_t d = 0; d < field.shape.size(); ++d) {
        if (field.shape[d] >= 0 && t.size(d + 1) != field.shape[d]) {
          return Fail("field '" + field.name + "' has shape " + c10::str(t.sizes()) +
                      "; the spec says [B]+" + c10::str(field.shape));
        }
      }
      if (field.num_classes > 0 &&
          (t.min().item<int64_t>() < 0 || t.max().item<int64_t>() >= field.num_classes)) {
        return Fail("field '" + field.name + "' holds class ids outside [0, " +
                    std::to_string(field.num_classes) + ")");
      }
    }
    auto out_of_range = GuardedCall("GetBatch", [&] { return data.GetBatch(split, {n}); });
    if (out_of_range.ok()) {
      return Fail("GetBatch accepted index " + std::to_string(n) + " of a " + std::to_string(n) +
                  "-example split");
    }
    if (out_of_range.status().code() == StatusCode::kInternal) {
      return Fail("GetBatch threw on an index out of range: " + out_of_range.status().message());
    }
  }
  auto second = open(7);
  if (!second.ok()) return Fail("a second Open failed: " + second.status().message());
  for (Split split : {Split::kTrain, Split::kEval}) {
    if ((*second)->size(split) != data.size(split)) return Fail("split sizes differ between opens");
    if (data.size(split) == 0) continue;
    auto a = data.GetBatch(split, {0});
    auto b = (*second)->GetBatch(split, {0});
    for (const auto& [name, tensor] : *a) {
      if (!at::equal(tensor, b->at(name))) {
        return Fail("the same seed gave different examples (" + name + ")");
      }
    }
  }
  if ((*second)->identity() != data.identity()) return Fail("the same data gave another identity");
  return Pass(spec.ToString() + "; " + WithThousands(data.size(Split::kTrain)) + " train / " +
              WithThousands(data.size(Split::kEval)) +
              " eval; batches match the spec; out-of-range indices refused; reproducible by seed");
}

// Long by design: a contract is the checklist a plugin author works through top to bottom, each
// early return one broken promise with its message, in the order the engine relies on them.
CheckResult ModelContract(const Subject& s) {
  auto options = UsableOptions(s);
  if (!options.ok()) return Skip(options.status().message());
  const auto& plugin = static_cast<const ModelLoaderPlugin&>(*s.loaded.plugin);
  DataSpec spec = SyntheticDataSpec();
  auto create = [&](uint64_t seed) {
    at::manual_seed(seed);
    return GuardedCall("Create", [&] {
      return plugin.Create(**options, ModelContext{&spec, s.base_dir, seed});
    });
  };
  auto a = create(1);
  if (!a.ok()) {
    return Skip("the model cannot be built for the made-up data " + spec.ToString() + ": " +
                a.status().message());
  }
  auto b = create(2);
  if (!b.ok()) return Fail("a second Create failed: " + b.status().message());
  torch::nn::Module& ma = (*a)->module();
  torch::nn::Module& mb = (*b)->module();
  if ((*a)->architecture().empty()) return Fail("architecture() is empty");

  // The census reads what the tensors are.
  const ParameterCensus census = TakeCensus(ma);
  const safetensors::NamedTensors state = StateOf(ma);
  if (census.size() != state.size() || state.empty()) {
    return Fail("the census has " + std::to_string(census.size()) + " tensors, the model " +
                std::to_string(state.size()));
  }
  for (size_t i = 0; i < state.size(); ++i) {
    if (census[i].name != state[i].first || census[i].dtype != state[i].second.scalar_type() ||
        census[i].numel != state[i].second.numel()) {
      return Fail("census entry '" + census[i].name + "' does not match the tensor");
    }
  }
  // Weights round-trip through safetensors into another instance, which then computes the same.
  const auto file = std::filesystem::temp_directory_path() /
                    ("engine-conformance-" + std::to_string(::getpid()) + ".safetensors");
  Status written = safetensors::Write(file, state);
  if (!written.ok()) return Fail("its weights cannot be saved: " + written.message());
  auto read = safetensors::File::Open(file);
  std::error_code ec;
  if (!read.ok()) {
    std::filesystem::remove(file, ec);
    return Fail(read.status().message());
  }
  {
    at::NoGradGuard no_grad;
    for (const auto& [name, tensor] : StateOf(mb)) {
      auto saved = (*read)->Get(name);
      if (!saved.ok()) {
        std::filesystem::remove(file, ec);
        return Fail("instance 2 has tensor '" + name + "', instance 1 does not");
      }
      at::Tensor target = tensor;
      target.copy_(*saved);
    }
  }
  std::filesystem::remove(file, ec);
  ma.eval();
  mb.eval();
  const Batch batch = SyntheticBatch(spec, 4);
  auto out_a = GuardedCall("Forward", [&] { return (*a)->Forward(batch); });
  auto out_b = GuardedCall("Forward", [&] { return (*b)->Forward(batch); });
  if (!out_a.ok()) return Fail("Forward: " + out_a.status().message());
  if (!out_b.ok()) return Fail("Forward: " + out_b.status().message());
  if (!out_a->loss.defined() || out_a->loss.dim() != 0) return Fail("the loss is not a scalar");
  if (const at::Tensor& count = out_a->loss_count_tensor;
      count.defined() && (count.dim() != 0 || !at::isIntegralType(count.scalar_type(), false))) {
    return Fail("loss_count_tensor is not an integer scalar");
  }
  if (LossCountOf(*out_a) <= 0) return Fail("loss_count is not positive");
  if (!std::isfinite(out_a->loss.item<double>())) return Fail("the loss is not finite");
  if (!at::equal(out_a->loss, out_b->loss)) {
    return Fail(
        "after loading instance 1's saved weights, instance 2 computes another loss: state "
        "lives outside the parameters and buffers");
  }
  // Training gives every trainable parameter a gradient of its own dtype.
  ma.train();
  auto train = GuardedCall("Forward", [&] { return (*a)->Forward(batch); });
  if (!train.ok()) return Fail("Forward in training mode: " + train.status().message());
  train->loss.backward();
  int64_t with_grad = 0;
  for (const auto& p : ma.named_parameters(true)) {
    if (!p.value().requires_grad() || !p.value().grad().defined()) continue;
    ++with_grad;
    if (p.value().grad().scalar_type() != p.value().scalar_type()) {
      return Fail("the gradient of '" + p.key() + "' has another dtype than the parameter");
    }
  }
  if (with_grad == 0) return Fail("backward gave no parameter a gradient");
  return Pass(std::to_string(state.size()) +
              " tensors; the census matches them; weights round-trip "
              "through safetensors into a second instance that computes the same loss; " +
              std::to_string(with_grad) + " parameters get gradients");
}

// Long by design: a contract is the checklist a plugin author works through top to bottom, each
// early return one broken promise with its message, in the order the engine relies on them.
CheckResult PrecisionContract(const Subject& s) {
  auto options = UsableOptions(s);
  if (!options.ok()) return Skip(options.status().message());
  const auto& plugin = static_cast<const PrecisionPolicyPlugin&>(*s.loaded.plugin);
  auto policy = GuardedCall("Create", [&] { return plugin.Create(**options); });
  if (!policy.ok()) return Fail("Create: " + policy.status().message());

  torch::nn::Linear layer(8, 4);
  layer->register_buffer("count", at::ones({1}, at::kLong));
  PrecisionRequest request;
  request.census = TakeCensus(*layer);
  request.device = ProbeDevice("cpu");
  OptionErrors errors;
  auto plan = GuardedCall("MakePlan", [&] { return (*policy)->MakePlan(request, &errors); });
  if (!errors.empty()) return Fail("MakePlan reported option errors: " + JoinErrors(errors));
  if (!plan.ok()) {
    return Skip("this policy does not run on " + request.device.Describe() + ": " +
                plan.status().message());
  }
  Status invariants = CheckPlanInvariants(*plan, request.device);
  if (!invariants.ok()) return Fail(invariants.message());
  if (plan->tensors.size() != request.census.size()) return Fail("the plan leaves tensors out");

  auto runtime = PrecisionRuntime::Apply(*plan, *layer, at::kCPU);
  if (!runtime.ok()) return Fail(runtime.status().message());
  // Fixed and small: random inputs under fp16's initial loss scale (65536) overflowed the
  // gradients now and then, which is the scaler's business, not a broken policy.
  const at::Tensor x = at::linspace(-1.0, 1.0, 16).view({2, 8});
  at::Tensor main_output;
  {
    auto scope = (*runtime)->context().Enter();
    main_output = layer->forward(x);
  }
  // F4: the captured context on a worker thread gives the same output.
  at::Tensor worker_output;
  std::string worker_error;
  {
    auto scope = (*runtime)->context().Enter();
    const PrecisionContext captured = PrecisionContext::Capture();
    std::thread worker([&] {
      try {
        auto worker_scope = captured.Enter();
        worker_output = layer->forward(x);
      } catch (...) {
        worker_error = CurrentExceptionMessage();
      }
    });
    worker.join();
  }
  if (!worker_error.empty()) return Fail("forward on a worker thread failed: " + worker_error);
  if (!at::equal(worker_output, main_output)) {
    return Fail(
        "forward on a worker thread under the captured context differs from the main "
        "thread's");
  }
  // The optimizer gets gradients of its own dtype (F6).
  (*runtime)->ZeroGrad();
  {
    auto scope = (*runtime)->context().Enter();
    at::Tensor loss = layer->forward(x).to(at::kFloat).pow(2).mean();
    (loss * (*runtime)->loss_scale()).backward();
  }
  if (!(*runtime)->UnscaleAndCheck()) return Fail("the gradients of a small step are not finite");
  const std::vector<NamedParameter>& updated = (*runtime)->optimizer_parameters();
  const std::vector<GradientFeed>& feeds = (*runtime)->feeds();
  for (size_t i = 0; i < updated.size(); ++i) {
    const NamedParameter& p = updated[i];
    // A master's low-precision gradient is fed with its factor, and unscaled into f32 by the step.
    if (i < feeds.size() && feeds[i].grad.defined()) continue;
    if (!p.tensor.grad().defined()) return Fail("'" + p.name + "' got no gradient");
    if (p.tensor.grad().scalar_type() != p.tensor.scalar_type()) {
      return Fail("the optimizer would see a " +
                  std::string(DtypeShortName(p.tensor.grad().scalar_type())) + " gradient for " +
                  std::string(DtypeShortName(p.tensor.scalar_type())) + " weights ('" + p.name +
                  "')");
    }
  }
  proto::Optimizer adamw;
  adamw.mutable_adamw();
  auto optimizer = MakeOptimizer(adamw, updated);
  try {
    (*runtime)->Step(*optimizer, 1e-3);
  } catch (const std::exception& e) {
    return Fail(std::string("an AdamW step on the plan's weights failed: ") + e.what());
  }
  if (Status state = (*runtime)->VerifyOptimizerState(*optimizer); !state.ok()) {
    return Fail(state.message());
  }
  return Pass("plan '" + plan->policy + "' on " + request.device.Describe() +
              " holds the invariants; the captured context gives the same output on a worker "
              "thread; an AdamW step keeps its state in the dtype of the weights it updates");
}

// Long by design: a contract is the checklist a plugin author works through top to bottom, each
// early return one broken promise with its message, in the order the engine relies on them.
CheckResult CallbackContract(const Subject& s) {
  auto options = UsableOptions(s);
  if (!options.ok()) return Skip(options.status().message());
  const auto& plugin = static_cast<const CallbackPlugin&>(*s.loaded.plugin);
  const auto dir = std::filesystem::temp_directory_path() /
                   ("engine-conformance-callback-" + std::to_string(::getpid()));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  auto callback = GuardedCall("Create", [&] {
    return plugin.Create(**options, CallbackContext{"conformance", s.base_dir, dir, "stage"});
  });
  if (!callback.ok()) {
    RemoveTree(dir, ec);
    return Fail("Create: " + callback.status().message());
  }
  NoActions actions;
  int delivered = 0;
  for (const Event& event : SyntheticEvents()) {
    Status status = GuardedCall("OnEvent", [&] { return (*callback)->OnEvent(event, actions); });
    if (!status.ok()) {
      RemoveTree(dir, ec);
      return Fail("on " + std::string(EventTypeName(event.type)) + " at step " +
                  std::to_string(event.step) + ": " + status.message() +
                  " (the engine would survive it, but a callback should not fail on ordinary "
                  "events)");
    }
    ++delivered;
  }
  // What it saves for a resume reads back into a fresh instance, which then saves the same.
  std::string state;
  Status saved = GuardedCall("SaveState", [&] {
    state = (*callback)->SaveState();
    return Status::Ok();
  });
  std::string round_trip;
  if (saved.ok() && !state.empty()) {
    auto fresh = GuardedCall("Create", [&] {
      return plugin.Create(**options, CallbackContext{"conformance", s.base_dir, dir, "stage"});
    });
    saved = fresh.ok() ? GuardedCall("RestoreState", [&] { return (*fresh)->RestoreState(state); })
                       : fresh.status();
    if (saved.ok()) {
      saved = GuardedCall("SaveState of the restored instance", [&] {
        round_trip = (*fresh)->SaveState();
        return Status::Ok();
      });
    }
    if (saved.ok() && round_trip != state) {
      saved = InternalError("a fresh instance given the saved state '" + state + "' saves '" +
                            round_trip + "'");
    }
  }
  RemoveTree(dir, ec);
  if (!saved.ok()) {
    return Fail("its state for a resume does not round-trip: " + saved.message());
  }
  return Pass(std::to_string(delivered) +
              " events of every type taken without an error; callbacks receive no model, so "
              "they cannot change it; " +
              (state.empty() ? std::string("no state to keep across a resume")
                             : "its " + std::to_string(state.size()) +
                                   "-byte state round-trips through a fresh instance"));
}

}  // namespace engine::conformance
