// Model loader plugins: build (or load) a trainable module and define its forward pass and loss.
//
// A Model owns a torch::nn::Module. The engine reads its parameters by name (trainable selection,
// census, optimizer, checkpoints), moves it to the stage's device and dtypes, and calls Forward
// with batches from the stage's data loader. Parameter names are the checkpoint's tensor names.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/data.h"
#include "engine/plugin.h"
#include "engine/precision.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace engine {

class LinearImpl;

// A metric summed over examples: its value is sum / count, or exp(sum / count) for metrics such as
// perplexity (the exponential of a mean negative log-likelihood).
struct Metric {
  double sum = 0;
  double count = 0;
  bool exp_of_mean = false;
  double mean() const { return count > 0 ? sum / count : 0; }
  double value() const;
};

struct ModelOutput {
  // A scalar: the mean loss over the `loss_count` terms of this batch that count (examples, or
  // tokens that are not masked). The engine weights micro-batches by loss_count when it
  // accumulates.
  at::Tensor loss;
  int64_t loss_count = 0;
  // Set instead of loss_count by a model that counts its terms on the device (the tokens that are
  // not masked): that count as a 0-dim integer tensor there, with `loss` still its mean (0, tied
  // to the inputs, when nothing counts). The engine reads it with the step's other scalars, in the
  // step's one synchronisation, where reading it in Forward would cost one per micro-batch.
  at::Tensor loss_count_tensor;
  // Metrics summed over the batch, e.g. {"accuracy", {correct, examples}}. The engine reads them
  // only when evaluating, so a model may skip them in training mode.
  std::map<std::string, Metric> metrics;
};

// The number of loss terms `output` reports: loss_count, or loss_count_tensor read from the device
// (a synchronisation) where the model left the count there.
inline int64_t LossCountOf(const ModelOutput& output) {
  return output.loss_count_tensor.defined() ? output.loss_count_tensor.item<int64_t>()
                                            : output.loss_count;
}

class Model {
 public:
  virtual ~Model() = default;

  virtual torch::nn::Module& module() = 0;
  // Runs the model on a batch (on the model's device) and returns the loss and metrics. Train or
  // eval behaviour follows module().is_training(). Called from one thread at a time.
  virtual StatusOr<ModelOutput> Forward(const Batch& batch) = 0;
  // What was built, e.g. "mlp".
  virtual std::string architecture() const = 0;
  // The resolved configuration as JSON (sizes taken from the data included). Checkpoints store it
  // in the manifest and as `config.json` beside the weights, so a loader that reads a model
  // directory (config.json + model.safetensors, as Hugging Face lays them out) can read a
  // checkpoint.
  virtual std::string config_json() const = 0;
  // Parts of the model that compute in a fixed dtype whatever the precision policy (failure
  // catalogue F3); the model runs them with PrecisionContext::None(). The plan lists them.
  virtual std::vector<ComputeDeclaration> compute_declarations() const { return {}; }
  // Batch fields Forward reads on the host (token ids it turns into positions, image grids). The
  // trainer hands these over where the data loader made them, on the CPU, instead of moving them
  // to the device, so that reading them costs no synchronisation with the device; Forward moves
  // what it also needs on the device itself. Other callers may still pass them on the device.
  virtual std::vector<std::string> host_fields() const { return {}; }
  // Where Hugging Face's model class names a module otherwise than this model names its tensors
  // (transformers 5's Qwen2-VL: the module "model.language_model.layers.0" of the checkpoint's
  // "model.layers.0"): (this model's prefix, transformers' prefix) pairs, the first that matches
  // applies. Exports that name modules rather than checkpoint tensors (PEFT's adapter files and
  // target_modules) use transformers' names. Empty: the same names.
  virtual std::vector<std::pair<std::string, std::string>> transformers_module_prefixes() const {
    return {};
  }
  // The full names of the modules Forward runs through RunBlock (engine/model_block.h), e.g.
  // "model.layers.0", in the order Forward runs them: what a stage that splits the parameters
  // across ranks (shard_level 3) gathers one at a time, the next one while one runs. Their
  // trainable parameters are gathered for each block's run; the model's other trainable parameters
  // stay whole on every rank. Empty (the default): the model runs no blocks that way, and such a
  // stage is refused.
  virtual std::vector<std::string> blocks() const { return {}; }
  // Whether Forward(batch) in evaluation (the module not training) reaches the trainable
  // parameters of blocks() only through RunBlock, running each block once in their order, as it
  // does in training. A shard_level 3 stage then evaluates the batch a block at a time, gathering
  // each block's parameters as training does; otherwise (the default) it makes every parameter
  // whole on every rank for the batch: for an evaluation that generates answers token by token
  // through its layers, say.
  virtual bool EvaluatesBlockByBlock(const Batch& /*batch*/) const { return false; }
};

struct ModelContext {
  // What the stage's data loader produces.
  const DataSpec* data = nullptr;
  std::filesystem::path base_dir;
  uint64_t seed = 0;
  // For loaders that read weights into the model they build: call it once for each engine::Linear
  // (engine/linear.h) right after its weight is read, with the layer's full name. When the stage
  // quantizes that layer, the engine does it here, so a 4-bit stage never holds the whole dense
  // model; otherwise it does nothing. Empty when there is nothing to do. An error is the loader's
  // to return. Loaders that do not call it are still correct: the engine applies the stage's
  // quantizer after Create to every layer not quantized yet.
  std::function<Status(const std::string& name, LinearImpl& layer)> linear_loaded = {};
  // Whether the stage quantizes the engine::Linear of that full name: for a loader's estimate of
  // the memory a load needs before it starts. Empty when the stage quantizes nothing.
  std::function<bool(const std::string& name)> quantizes = {};
  // True when the engine only plans the model (commands plan the stages of their pipeline this
  // way, then build the models they use again): it reads the model's names, shapes and dtypes,
  // and quantizes the layers the stage selects, but never its values. A loader may then build under
  // UninitializedParametersScope and give values only to the weights of the layers `quantizes`
  // selects (drawn at random), handing each to linear_loaded at once (a quantizer needs finite
  // values), so that planning a model larger than memory touches little of it. Loaders that draw
  // or read everything anyway are still correct.
  bool plan_only = false;
};

class ModelLoaderPlugin : public Plugin {
 public:
  PluginKind kind() const final { return PluginKind::kModelLoader; }

  // Builds the model on the CPU. The engine seeds LibTorch's generator with the stage seed first,
  // so random initialisation is reproducible.
  virtual StatusOr<std::unique_ptr<Model>> Create(const google::protobuf::Message& options,
                                                  const ModelContext& context) const = 0;

  // The `model_type`s (config.json) of the Hugging Face model directories this loader builds from
  // its `pretrained` option: what `engine generate` and `export` pick a loader for a model
  // directory by. Empty (the default) for a loader of models of its own; no two installed loaders
  // may declare the same type.
  virtual std::vector<std::string> model_types() const { return {}; }
};

}  // namespace engine
