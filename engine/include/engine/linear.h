// engine::Linear: the linear layer that quantizer and adapter plugins can act on.
//
// Model plugins build their projections from engine::Linear instead of torch::nn::Linear. At first
// it is a plain linear layer with a `weight` parameter [out, in] (and an optional `bias`), so names
// and checkpoints are what torch::nn::Linear gives. The engine then, as a stage says:
//   - quantizes it (Quantize): the dense parameter is replaced by the quantized format's buffers,
//     stored under the layer ("weight", "weight_absmax", ...), frozen; the forward pass multiplies
//     in the layer's compute dtype (the one the quantizer declares, or the stage's, which the
//     engine sets when the quantizer's options leave it open) and returns the input's dtype; the
//     backward gives the input its gradient and the weight none;
//   - attaches adapters (AddAdapter): each registers its own parameters under the layer (LoRA's
//     "lora_A", "lora_B", as PEFT names them) and adds its output to the layer's;
//   - merges adapters into a dense weight and unmerges them again (MergeAdapters/UnmergeAdapters).
//
// Ownership: the layer owns its quantized weight and adapters (shared, so graphs in flight keep
// them alive). Threads: like any torch::nn::Module, one thread at a time. Failures: the mutating
// methods return a Status saying what is wrong; forward throws only what LibTorch throws.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/status.h"

namespace engine {

// A weight [rows, cols] held in a quantized format. Immutable once made.
class QuantizedWeight {
 public:
  virtual ~QuantizedWeight() = default;
  // "nf4", "int8", ...
  virtual std::string format() const = 0;
  virtual int64_t rows() const = 0;
  virtual int64_t cols() const = 0;
  // The dtype the quantizer's options declare (never taken from inputs): the matmul's, unless the
  // layer overrides it (LinearImpl::quantized_compute_dtype).
  virtual c10::ScalarType compute_dtype() const = 0;
  // Rows [begin, end) of the dense weight in `dtype`, as a [end - begin, cols] tensor.
  virtual at::Tensor DequantizeRows(int64_t begin, int64_t end, c10::ScalarType dtype) const = 0;
  // The tensors that store it, named as the layer's buffers ("weight", "weight_absmax", ...). The
  // layer registers exactly these tensors, so moving the module moves them.
  virtual std::vector<std::pair<std::string, at::Tensor>> tensors() const = 0;
  // The same format and settings applied to another dense weight of the same shape
  // (dequantize-merge-requantize).
  virtual StatusOr<std::shared_ptr<QuantizedWeight>> QuantizeLike(
      const at::Tensor& dense) const = 0;

  int64_t storage_bytes() const;
  // Storage bits per weight element (4.127 for NF4 with double quantization at block 64).
  double bits_per_parameter() const;
};

// An adapter on one engine::Linear: a trainable side path whose output is added to the layer's.
class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  // Its modules, registered under the layer by these names (e.g. {"lora_A", ...}).
  virtual std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules() = 0;
  // What it adds to the layer's output for input `x` [..., in].
  virtual at::Tensor Delta(const at::Tensor& x) = 0;
  // The same contribution as a weight delta [out, in] in f32, for merging.
  virtual at::Tensor WeightDelta() = 0;
};

// While one is alive on its thread, new Linear layers get uninitialized parameters: no random
// values are drawn and no memory is touched (a model's other modules may ask active() and do the
// same, as the Llama embedding does). For building a model whose weights are read from a
// checkpoint next (the kernel gives the untouched memory back when they are replaced), or one whose
// values nobody reads (ModelContext::plan_only). Scopes nest.
class UninitializedParametersScope {
 public:
  UninitializedParametersScope();
  ~UninitializedParametersScope();
  UninitializedParametersScope(const UninitializedParametersScope&) = delete;
  UninitializedParametersScope& operator=(const UninitializedParametersScope&) = delete;
  static bool active();

 private:
  bool previous_;
};

class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool with_bias = false);
  at::Tensor forward(const at::Tensor& x);

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

  // The dense weight parameter; undefined once quantized.
  at::Tensor weight;
  at::Tensor bias;

  // Replaces the dense weight by `quantized` (same shape). Fails when already quantized or the
  // shape differs.
  Status Quantize(std::shared_ptr<QuantizedWeight> quantized);
  const std::shared_ptr<QuantizedWeight>& quantized() const { return quantized_; }
  // The dtype the quantized matmul runs in: set by SetQuantizedComputeDtype, else the quantized
  // weight's declared one. Only for a quantized layer.
  c10::ScalarType quantized_compute_dtype() const;
  // The engine sets the stage's compute dtype here when the quantizer leaves it to the stage (an
  // f32 stage must not multiply in bf16 behind its plan's back). Kept across Quantize.
  void SetQuantizedComputeDtype(c10::ScalarType dtype) { quantized_compute_ = dtype; }
  // The dense weight in `dtype`: the parameter's values, or the quantized weight dequantized.
  at::Tensor DenseWeight(c10::ScalarType dtype) const;

  // Sets the base weight from a dense [out, in] tensor (any float dtype): copied into the dense
  // parameter, or quantized like the current quantized weight and written over it in place. Used to
  // start a quantized stage from a parent's dense checkpoint. Adapters are left as they are.
  Status LoadDenseWeight(const at::Tensor& dense);

  Status AddAdapter(std::shared_ptr<LinearAdapter> adapter);
  const std::vector<std::shared_ptr<LinearAdapter>>& adapters() const { return adapters_; }
  // The adapters' tensors, named as the layer holds them ("lora_A.weight"), parameters and
  // buffers.
  std::vector<std::string> AdapterTensorNames() const;
  // The base weight with every adapter's delta added, f32 on the CPU, computed in f32 (what
  // MergeAdapters would store, before any rounding to the layer's dtype or format). The layer is
  // not changed.
  at::Tensor MergedWeight() const;

  // Folds every adapter's WeightDelta into the base weight, after which forward skips them. A
  // quantized base is dequantized, merged and requantized only with `requantize` (it loses
  // precision); without it a quantized base is an error.
  Status MergeAdapters(bool requantize = false);
  // Subtracts the adapters' deltas again (equal to the unmerged weight up to rounding; a quantized
  // base is requantized).
  Status UnmergeAdapters();
  bool merged() const { return merged_; }

 private:
  void RegisterQuantizedTensors();
  Status OverwriteQuantized(const QuantizedWeight& replacement);
  // Every adapter's WeightDelta summed, f32 on the CPU.
  at::Tensor AdapterDelta() const;

  int64_t in_features_, out_features_;
  bool has_bias_;
  std::shared_ptr<QuantizedWeight> quantized_;
  std::optional<c10::ScalarType> quantized_compute_;
  std::vector<std::shared_ptr<LinearAdapter>> adapters_;
  bool merged_ = false;
};
TORCH_MODULE(Linear);

// The outputs of `layers` for one input side by side ([..., sum of out_features], in the layers'
// order) from one product with their concatenated weights: what each forward computes, in one
// matmul instead of several (wider products run closer to the CPU's peak, and the backward gives x
// one gradient instead of a sum). Undefined when they cannot go together: a quantized layer, an
// unmerged adapter, other input sizes, dtypes or devices, or biases on some layers only; or when
// they should not: x has too few rows (fewer than 1024) for the wider product to repay the copy of
// the weights it takes. The caller then runs them one by one.
at::Tensor ForwardConcatenated(const std::vector<LinearImpl*>& layers, const at::Tensor& x);

// x @ W^T for a quantized W, in `compute` (default: W's declared compute dtype), without
// materialising the whole dense weight (row tiles are dequantized and multiplied in turn).
// Differentiable in x only; the backward multiplies in the same dtype.
at::Tensor QuantizedMatmul(const at::Tensor& x, std::shared_ptr<const QuantizedWeight> weight,
                           std::optional<c10::ScalarType> compute = std::nullopt);

// Every engine::Linear in `module`, with its name ("model.layers.0.self_attn.q_proj").
std::vector<std::pair<std::string, std::shared_ptr<LinearImpl>>> NamedLinears(
    torch::nn::Module& module);

}  // namespace engine
