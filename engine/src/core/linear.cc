#include "engine/linear.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>

#include "core/module_tensors.h"
#include "engine/few_rows_matmul.h"
#include "engine/torch_compat.h"

namespace engine {
namespace {

// Dense bytes of one dequantized tile, never the whole dense weight of a large layer. On the CPU,
// large enough for an efficient GEMM and small enough to stay in cache: on a 2 MiB-L2 Xeon, 4 MiB
// tiles ran the 4-bit bf16 forward at 0.72 of dense and 1 MiB tiles at 0.62 (bench/quant_bench,
// 4096 x 4096, 256 tokens; 8 and 16 MiB were no better). On a GPU a tile that small
// (512 rows of a 4096-wide bf16 weight) leaves most of the device idle in each GEMM, and the
// dequantize runs near memory speed, so tiles are larger.
constexpr int64_t kCpuTileBytes = int64_t{4} << 20;
constexpr int64_t kGpuTileBytes = int64_t{64} << 20;

int64_t TileRows(const QuantizedWeight& w, c10::ScalarType dtype, const at::Device& device) {
  const int64_t row_bytes = std::max<int64_t>(1, w.cols() * c10::elementSize(dtype));
  return std::max<int64_t>(1, (device.is_cpu() ? kCpuTileBytes : kGpuTileBytes) / row_bytes);
}

// y [n, rows] = x [n, cols] @ W^T, tile by tile, in `dtype`. Autocast is off inside: the compute
// dtype is the layer's, whatever region the caller is in.
at::Tensor TiledForward(const at::Tensor& x2d, const QuantizedWeight& w, c10::ScalarType dtype) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  if (x2d.size(0) <= FewRowsMatmul::kMaxRows) {
    if (const auto* direct = dynamic_cast<const FewRowsMatmul*>(&w)) {
      at::Tensor y = direct->MatmulFewRows(x2d, dtype);
      if (y.defined()) return y;
    }
  }
  const at::Tensor x = x2d.to(dtype);
  const int64_t rows = w.rows(), tile = TileRows(w, dtype, x.device());
  if (tile >= rows) return at::mm(x, w.DequantizeRows(0, rows, dtype).to(x.device()).t());
  at::Tensor y = at::empty({x.size(0), rows}, x.options());
  for (int64_t r = 0; r < rows; r += tile) {
    const int64_t end = std::min(rows, r + tile);
    // Straight into y's columns (a strided block GEMM writes in place), not through a copy.
    at::Tensor columns = y.narrow(1, r, end - r);
    at::mm_out(columns, x, w.DequantizeRows(r, end, dtype).to(x.device()).t());
  }
  return y;
}

// dx [n, cols] = dy [n, rows] @ W, accumulated over row tiles.
at::Tensor TiledInputGrad(const at::Tensor& dy2d, const QuantizedWeight& w, c10::ScalarType dtype) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor dy = dy2d.to(dtype);
  const int64_t rows = w.rows(), tile = TileRows(w, dtype, dy.device());
  if (tile >= rows) return at::mm(dy, w.DequantizeRows(0, rows, dtype).to(dy.device()));
  at::Tensor dx = at::zeros({dy.size(0), w.cols()}, dy.options());
  for (int64_t r = 0; r < rows; r += tile) {
    const int64_t end = std::min(rows, r + tile);
    dx.addmm_(dy.narrow(1, r, end - r), w.DequantizeRows(r, end, dtype).to(dy.device()));
  }
  return dx;
}

// The backward of QuantizedMatmul: the input's gradient only; the weight is frozen.
struct QuantizedMatmulBackward : public torch::autograd::Node {
  std::shared_ptr<const QuantizedWeight> weight;
  std::vector<int64_t> input_sizes;
  c10::ScalarType input_dtype = at::kFloat;
  c10::ScalarType compute = at::kFloat;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const at::Tensor& dy = grads[0];
    if (!dy.defined()) return {at::Tensor()};
    at::Tensor dx = TiledInputGrad(dy.reshape({-1, weight->rows()}), *weight, compute);
    return {dx.view(input_sizes).to(input_dtype)};
  }
  std::string name() const override { return "engine::QuantizedMatmulBackward"; }
};

}  // namespace

int64_t QuantizedWeight::storage_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, t] : tensors()) bytes += t.nbytes();
  return bytes;
}

FewRowsMatmul::~FewRowsMatmul() = default;

double QuantizedWeight::bits_per_parameter() const {
  const double elements = static_cast<double>(rows()) * static_cast<double>(cols());
  return elements > 0 ? 8.0 * static_cast<double>(storage_bytes()) / elements : 0.0;
}

at::Tensor QuantizedMatmul(const at::Tensor& x, std::shared_ptr<const QuantizedWeight> weight,
                           std::optional<c10::ScalarType> compute) {
  const c10::ScalarType dtype = compute.value_or(weight->compute_dtype());
  TORCH_CHECK(x.size(-1) == weight->cols(), "quantized matmul: the input has ", x.size(-1),
              " features, the weight ", weight->cols());
  std::vector<int64_t> out_sizes = x.sizes().vec();
  out_sizes.back() = weight->rows();
  at::Tensor y;  // [n, rows], a fresh tensor (not a view), so it can take a grad_fn
  {
    at::NoGradGuard no_grad;
    y = TiledForward(x.reshape({-1, weight->cols()}), *weight, dtype);
  }
  if (x.requires_grad() && at::GradMode::is_enabled()) {
    auto node = std::shared_ptr<QuantizedMatmulBackward>(new QuantizedMatmulBackward(),
                                                         torch::autograd::deleteNode);
    node->weight = std::move(weight);
    node->input_sizes = x.sizes().vec();
    node->input_dtype = x.scalar_type();
    node->compute = dtype;
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    torch::autograd::set_history(y, node);
  }
  y = y.view(out_sizes);
  return y;
}

namespace {
thread_local bool uninitialized_parameters = false;
}  // namespace

UninitializedParametersScope::UninitializedParametersScope() : previous_(uninitialized_parameters) {
  uninitialized_parameters = true;
}
UninitializedParametersScope::~UninitializedParametersScope() {
  uninitialized_parameters = previous_;
}
bool UninitializedParametersScope::active() { return uninitialized_parameters; }

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool with_bias)
    : in_features_(in_features), out_features_(out_features), has_bias_(with_bias) {
  weight = register_parameter("weight", at::empty({out_features, in_features}));
  if (has_bias_) bias = register_parameter("bias", at::empty({out_features}));
  if (UninitializedParametersScope::active()) return;
  // torch::nn::Linear's initialisation, so swapping it for this changes nothing.
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (has_bias_) {
    const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0;
    at::NoGradGuard no_grad;
    bias.uniform_(-bound, bound);
  }
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  at::Tensor y;
  if (quantized_ != nullptr) {
    y = QuantizedMatmul(x, quantized_, quantized_compute_);
    // Under autocast the product stays in the autocast dtype, bias included, as a dense layer's
    // at::matmul and at::addmm leave it; otherwise it comes out in the input's dtype. Casting it
    // back to an f32 input's dtype kept every activation after a 4-bit layer in f32: a QLoRA
    // forward in bf16-mixed took 1.6x a LoRA one's on Qwen2.5-0.5B.
    const c10::DeviceType device = x.device().type();
    const bool autocast =
        compat::AutocastEnabled(device) && compat::AutocastDtype(device) == y.scalar_type();
    if (!autocast) y = y.to(x.scalar_type());
    if (bias.defined()) y = y + (autocast ? bias.to(y.scalar_type()) : bias);
  } else {
    // As torch::nn::Linear computes it. at::linear would differ under autocast: it casts the leaf
    // weight through autocast's cache, which a checkpointed block's recomputation then reuses.
    y = x.dim() == 2 && bias.defined() ? at::addmm(bias, x, weight.t()) : at::matmul(x, weight.t());
    if (x.dim() != 2 && bias.defined()) y = y + bias;
  }
  if (!merged_) {
    for (const auto& adapter : adapters_) y = y + adapter->Delta(x);
  }
  return y;
}

at::Tensor ForwardConcatenated(const std::vector<LinearImpl*>& layers, const at::Tensor& x) {
  // The concatenated weight is a copy made on every call. Measured on 2 CPU threads with
  // Qwen2.5-0.5B's gate/up (2 x 4864 x 896, f32): one product on the copy took 6.6x as long as two
  // products for 1 row (a generated token), 1.1x for 512 rows, 0.88x for 2048. Below this many
  // rows the copy costs more than the wider product saves.
  constexpr int64_t kMinRowsToConcatenate = 1024;
  if (layers.empty() || x.dim() == 0 || x.numel() < kMinRowsToConcatenate * x.size(-1)) {
    return at::Tensor();
  }
  const LinearImpl& first = *layers.front();
  std::vector<at::Tensor> weights, biases;
  for (const LinearImpl* layer : layers) {
    const bool plain =
        layer->quantized() == nullptr && (layer->adapters().empty() || layer->merged());
    if (!plain || !layer->weight.defined() || layer->in_features() != first.in_features() ||
        layer->weight.scalar_type() != first.weight.scalar_type() ||
        layer->weight.device() != first.weight.device() ||
        layer->bias.defined() != first.bias.defined()) {
      return at::Tensor();
    }
    weights.push_back(layer->weight);
    if (layer->bias.defined()) biases.push_back(layer->bias);
  }
  const at::Tensor weight = at::cat(weights, 0);
  if (biases.empty()) return at::matmul(x, weight.t());
  const at::Tensor bias = at::cat(biases, 0);
  return x.dim() == 2 ? at::addmm(bias, x, weight.t()) : at::matmul(x, weight.t()) + bias;
}

void LinearImpl::RegisterQuantizedTensors() {
  for (const auto& [name, tensor] : quantized_->tensors()) register_buffer(name, tensor);
}

Status LinearImpl::OverwriteQuantized(const QuantizedWeight& replacement) {
  const auto now = quantized_->tensors();
  const auto next = replacement.tensors();
  if (now.size() != next.size()) return InternalError("the requantized weight has other tensors");
  for (size_t i = 0; i < now.size(); ++i) {
    if (now[i].first != next[i].first || !now[i].second.sizes().equals(next[i].second.sizes()) ||
        now[i].second.scalar_type() != next[i].second.scalar_type()) {
      return InternalError("the requantized weight's '" + next[i].first + "' differs in layout");
    }
  }
  // In place, so the layer's buffers (and whatever moved them) stay the tensors in use.
  for (size_t i = 0; i < now.size(); ++i) now[i].second.copy_(next[i].second);
  return Status::Ok();
}

Status LinearImpl::LoadDenseWeight(const at::Tensor& dense) {
  if (dense.dim() != 2 || dense.size(0) != out_features_ || dense.size(1) != in_features_) {
    return InvalidArgumentError("the dense weight is " + c10::str(dense.sizes()) + ", the layer [" +
                                std::to_string(out_features_) + ", " +
                                std::to_string(in_features_) + "]");
  }
  if (merged_) return FailedPreconditionError("unmerge the adapters before loading a weight");
  at::NoGradGuard no_grad;
  if (quantized_ == nullptr) {
    weight.copy_(dense);
    return Status::Ok();
  }
  ENGINE_ASSIGN_OR_RETURN(auto requantized, quantized_->QuantizeLike(dense.to(at::kFloat)));
  return OverwriteQuantized(*requantized);
}

Status LinearImpl::Quantize(std::shared_ptr<QuantizedWeight> quantized) {
  if (quantized == nullptr) return InvalidArgumentError("no quantized weight given");
  if (quantized_ != nullptr) {
    return FailedPreconditionError("the layer is already quantized (" + quantized_->format() + ")");
  }
  if (quantized->rows() != out_features_ || quantized->cols() != in_features_) {
    return InvalidArgumentError("the quantized weight is " + std::to_string(quantized->rows()) +
                                "x" + std::to_string(quantized->cols()) + ", the layer " +
                                std::to_string(out_features_) + "x" + std::to_string(in_features_));
  }
  if (merged_) return FailedPreconditionError("unmerge the adapters before quantizing");
  quantized_ = std::move(quantized);
  parameters_.erase("weight");
  weight = at::Tensor();
  RegisterQuantizedTensors();
  return Status::Ok();
}

c10::ScalarType LinearImpl::quantized_compute_dtype() const {
  TORCH_CHECK(quantized_ != nullptr, "quantized_compute_dtype of a dense layer");
  return quantized_compute_.value_or(quantized_->compute_dtype());
}

at::Tensor LinearImpl::DenseWeight(c10::ScalarType dtype) const {
  if (quantized_ == nullptr) return weight.detach().to(dtype);
  return quantized_->DequantizeRows(0, out_features_, dtype);
}

Status LinearImpl::AddAdapter(std::shared_ptr<LinearAdapter> adapter) {
  if (adapter == nullptr) return InvalidArgumentError("no adapter given");
  if (merged_) return FailedPreconditionError("unmerge the adapters before adding another");
  for (auto& [name, module] : adapter->modules()) {
    if (named_children().contains(name) || parameters_.contains(name) ||
        named_buffers(/*recurse=*/false).contains(name)) {
      return AlreadyExistsError("the layer already has a '" + name + "'");
    }
    register_module(name, module);
  }
  adapters_.push_back(std::move(adapter));
  return Status::Ok();
}

std::vector<std::string> LinearImpl::AdapterTensorNames() const {
  std::vector<std::string> names;
  for (const auto& adapter : adapters_) {
    for (const auto& [child, module] : adapter->modules()) {
      for (const ModuleTensor& t : ModuleTensors(*module)) names.push_back(child + "." + t.name);
    }
  }
  return names;
}

at::Tensor LinearImpl::MergedWeight() const {
  at::NoGradGuard no_grad;
  at::Tensor weight = DenseWeight(at::kFloat).cpu();
  if (!adapters_.empty() && !merged_) weight += AdapterDelta();
  return weight;
}

at::Tensor LinearImpl::AdapterDelta() const {
  // Exact f32 arithmetic, whatever autocast the caller's precision context has on (an adapter's
  // product under bf16 autocast would be rounded to bf16).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  at::Tensor delta = at::zeros({out_features_, in_features_}, at::kFloat);
  for (const auto& adapter : adapters_) delta += adapter->WeightDelta().to(at::kFloat).cpu();
  return delta;
}

Status LinearImpl::MergeAdapters(bool requantize) {
  if (merged_) return FailedPreconditionError("the adapters are merged already");
  if (adapters_.empty()) return FailedPreconditionError("the layer has no adapter to merge");
  at::NoGradGuard no_grad;
  const at::Tensor delta = AdapterDelta();
  if (quantized_ == nullptr) {
    weight.add_(delta.to(weight.device(), weight.scalar_type()));
  } else {
    if (!requantize) {
      return FailedPreconditionError(
          "the base weight is " + quantized_->format() +
          "; merging into it means dequantize, add, requantize, which loses precision: ask for it "
          "explicitly (requantize)");
    }
    ENGINE_ASSIGN_OR_RETURN(
        auto merged,
        quantized_->QuantizeLike(quantized_->DequantizeRows(0, out_features_, at::kFloat) + delta));
    ENGINE_RETURN_IF_ERROR(OverwriteQuantized(*merged));
  }
  merged_ = true;
  return Status::Ok();
}

Status LinearImpl::UnmergeAdapters() {
  if (!merged_) return FailedPreconditionError("the adapters are not merged");
  at::NoGradGuard no_grad;
  const at::Tensor delta = AdapterDelta();
  if (quantized_ == nullptr) {
    weight.sub_(delta.to(weight.device(), weight.scalar_type()));
  } else {
    ENGINE_ASSIGN_OR_RETURN(
        auto unmerged,
        quantized_->QuantizeLike(quantized_->DequantizeRows(0, out_features_, at::kFloat) - delta));
    ENGINE_RETURN_IF_ERROR(OverwriteQuantized(*unmerged));
  }
  merged_ = false;
  return Status::Ok();
}

std::vector<std::pair<std::string, std::shared_ptr<LinearImpl>>> NamedLinears(
    torch::nn::Module& module) {
  std::vector<std::pair<std::string, std::shared_ptr<LinearImpl>>> out;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    if (auto linear = std::dynamic_pointer_cast<LinearImpl>(item.value())) {
      out.emplace_back(item.key(), std::move(linear));
    }
  }
  return out;
}

}  // namespace engine
