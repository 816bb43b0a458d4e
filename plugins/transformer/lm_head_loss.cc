#include "lm_head_loss.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <optional>

#include "engine/torch_compat.h"
#include "engine_kernels/cpu_kernels_switch.h"
#include "engine_kernels/cross_entropy_rows.h"

namespace engine::transformer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kChunkBytes = int64_t{128} << 20;

// The dtype the head's matmul runs in: autocast's for the hidden states' device when it is on
// (as matmul would cast), else the hidden states' own.
at::ScalarType ComputeDtype(const at::Tensor& hidden) {
  const c10::DeviceType device = hidden.device().type();
  const bool autocast_device = device == c10::DeviceType::CPU || device == c10::DeviceType::CUDA;
  return autocast_device && compat::AutocastEnabled(device) ? compat::AutocastDtype(device)
                                                            : hidden.scalar_type();
}

// Vocabulary rows per product when a chunk's weight gradient is not in f32: the product's
// temporary stays ~50 MB instead of the whole head's size.
constexpr int64_t kVocabSlice = 16384;

// grad_weight (f32, [vocab, hidden]) += g^T h, without a temporary of grad_weight's size.
void AddWeightGrad(const at::Tensor& g, const at::Tensor& h, at::Tensor& grad_weight) {
  if (g.scalar_type() == at::kFloat) {
    grad_weight.addmm_(g.t(), h);
    return;
  }
  const int64_t vocab = grad_weight.size(0);
  for (int64_t v = 0; v < vocab; v += kVocabSlice) {
    const int64_t n = std::min(kVocabSlice, vocab - v);
    grad_weight.narrow(0, v, n).add_(at::mm(g.narrow(1, v, n).t(), h));
  }
}

struct ChunkedResult {
  at::Tensor loss_sum, predicted, grad_hidden, grad_weight;
};

// One chunk's logits ([n, vocab] in the compute dtype) scored with ATen, on any device: adds the
// loss terms of its counted rows to `loss_sum`, writes its argmax into `predicted` when defined,
// and returns d loss / d logits (softmax minus the target, over the count, 0 on rows not counted)
// in the compute dtype when `gradient`.
at::Tensor ScoreChunkWithAten(const at::Tensor& logits_in_compute, const at::Tensor& t,
                              int64_t ignore_index, const at::Tensor& divisor, bool gradient,
                              at::Tensor& loss_sum, at::Tensor predicted) {
  const at::Tensor logits = logits_in_compute.to(at::kFloat);
  const at::Tensor valid = t.ne(ignore_index);
  const at::Tensor index = t.masked_fill(valid.logical_not(), 0).unsqueeze(1);
  const at::Tensor lse = at::logsumexp(logits, -1, /*keepdim=*/true);
  const at::Tensor picked = logits.gather(1, index);
  loss_sum.add_(((lse - picked).squeeze(1) * valid).sum());
  if (predicted.defined()) predicted.copy_(logits.argmax(-1));
  if (!gradient) return {};
  at::Tensor g = (logits - lse).exp_();
  g.scatter_add_(1, index, at::full({t.size(0), 1}, -1.0, logits.options()));
  g.mul_((valid.to(at::kFloat) / divisor).unsqueeze(1));
  return g.to(logits_in_compute.scalar_type());
}

// The same through the fused CPU kernel, every row counted: the gradient is written over the
// logits, in their dtype.
at::Tensor ScoreChunkFused(const at::Tensor& logits, const at::Tensor& t, const at::Tensor& divisor,
                           bool gradient, at::Tensor& loss_sum, at::Tensor predicted) {
  // The divisor is in host memory here: read in place (item() would count as a device read).
  const std::optional<float> scale =
      gradient ? std::optional<float>(1.0f / *divisor.data_ptr<float>()) : std::nullopt;
  const kernels::CrossEntropyRowsResult scored =
      kernels::CrossEntropyRows(logits, t, predicted.defined(), scale);
  loss_sum.add_(scored.loss.sum());
  if (predicted.defined()) predicted.copy_(scored.argmax);
  return gradient ? logits : at::Tensor();
}

// Whether a chunk goes through the fused kernel, which takes counted rows only: on the CPU, with
// the kernels on. There every row reaching ScoreRows counts: RunChunks selects them.
bool FusedChunk(const at::Tensor& logits, const at::Tensor& t) {
  return logits.device().is_cpu() && kernels::CpuKernelsSwitchedOn() &&
         kernels::CrossEntropyRowsSupports(logits, t);
}

// The loop of ChunkedHeadCrossEntropy over every row given; gradients (already divided by
// `divisor`, the f32 count of targets, at least 1) when asked.
ChunkedResult ScoreRows(const at::Tensor& hidden, const at::Tensor& weight,
                        const at::Tensor& targets, int64_t ignore_index, const at::Tensor& divisor,
                        bool predictions, bool grad_hidden, bool grad_weight, int64_t chunk_rows) {
  const at::ScalarType compute = ComputeDtype(hidden);
  // The casts autocast would make, made once here; its keys are then off so that nothing is cast
  // (or cached) again per chunk.
  const at::Tensor h = hidden.to(compute), w = weight.to(compute);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(
      c10::DispatchKeySet({c10::DispatchKey::AutocastCPU, c10::DispatchKey::AutocastCUDA}));
  const int64_t rows = hidden.size(0), vocab = weight.size(0);
  const int64_t chunk = chunk_rows > 0 ? chunk_rows
                                       : std::clamp<int64_t>(kChunkBytes / (vocab * 4), 1,
                                                             std::max<int64_t>(rows, 1));
  const auto f32 = hidden.options().dtype(at::kFloat);
  ChunkedResult result;
  result.loss_sum = at::zeros({}, f32);
  if (predictions) result.predicted = at::empty({rows}, targets.options());
  if (grad_hidden) result.grad_hidden = at::empty(hidden.sizes(), hidden.options());
  if (grad_weight) result.grad_weight = at::zeros(weight.sizes(), f32);
  const bool gradient = grad_hidden || grad_weight;
  // Every chunk's logits in one buffer: a fresh 100+ MB tensor per chunk is fresh pages to fault
  // in and zero, every step.
  at::Tensor buffer;
  for (int64_t r = 0; r < rows; r += chunk) {  // no rows: chunk is 1, nothing runs
    const int64_t n = std::min(chunk, rows - r);
    const at::Tensor hc = h.narrow(0, r, n);
    const at::Tensor t = targets.narrow(0, r, n);
    if (!buffer.defined()) buffer = at::empty({std::min(chunk, rows), vocab}, h.options());
    at::Tensor logits = buffer.narrow(0, 0, n);
    at::mm_out(logits, hc, w.t());
    const at::Tensor predicted = predictions ? result.predicted.narrow(0, r, n) : at::Tensor();
    const at::Tensor gc =
        FusedChunk(logits, t)
            ? ScoreChunkFused(logits, t, divisor, gradient, result.loss_sum, predicted)
            : ScoreChunkWithAten(logits, t, ignore_index, divisor, gradient, result.loss_sum,
                                 predicted);
    if (!gradient) continue;
    if (grad_hidden) result.grad_hidden.narrow(0, r, n).copy_(at::matmul(gc, w));
    if (grad_weight) AddWeightGrad(gc, hc, result.grad_weight);
  }
  return result;
}

// The rows whose target counts, where reading the targets costs nothing (on the CPU) and some do
// not count; undefined otherwise (every row is scored).
at::Tensor CountedRowsOnHost(const at::Tensor& targets, int64_t ignore_index) {
  if (!targets.device().is_cpu()) return {};  // finding them would be a device synchronisation
  const at::Tensor index = targets.ne(ignore_index).nonzero().view({-1});
  return index.size(0) < targets.size(0) ? index : at::Tensor();
}

// ScoreRows for the rows that count only, where they can be found for free: a row whose target is
// ignored adds nothing to the loss and gets a zero gradient, and in a chat batch (prompts,
// padding) those are most rows, whose head product and softmax would be work thrown away. Their
// predictions are `ignore_index`.
ChunkedResult RunChunks(const at::Tensor& hidden, const at::Tensor& weight,
                        const at::Tensor& targets, int64_t ignore_index, const at::Tensor& divisor,
                        bool predictions, bool grad_hidden, bool grad_weight, int64_t chunk_rows) {
  const at::Tensor counted = CountedRowsOnHost(targets, ignore_index);
  if (!counted.defined()) {
    return ScoreRows(hidden, weight, targets, ignore_index, divisor, predictions, grad_hidden,
                     grad_weight, chunk_rows);
  }
  ChunkedResult result =
      ScoreRows(hidden.index_select(0, counted), weight, targets.index_select(0, counted),
                ignore_index, divisor, predictions, grad_hidden, grad_weight, chunk_rows);
  if (predictions) {
    result.predicted =
        at::full_like(targets, ignore_index).index_copy_(0, counted, result.predicted);
  }
  if (grad_hidden) {
    result.grad_hidden =
        at::zeros(hidden.sizes(), hidden.options()).index_copy_(0, counted, result.grad_hidden);
  }
  return result;
}

class ChunkedCrossEntropyFunction : public torch::autograd::Function<ChunkedCrossEntropyFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden,
                               const at::Tensor& weight, const at::Tensor& targets,
                               int64_t ignore_index, const at::Tensor& divisor, bool predictions,
                               bool grad_hidden, bool grad_weight, int64_t chunk_rows) {
    ChunkedResult result = RunChunks(hidden, weight, targets, ignore_index, divisor, predictions,
                                     grad_hidden, grad_weight, chunk_rows);
    ctx->save_for_backward({result.grad_hidden, result.grad_weight});
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    const at::Tensor loss = result.loss_sum / divisor;
    if (!predictions) return {loss};
    ctx->mark_non_differentiable({result.predicted});
    return {loss, result.predicted};
  }

  // Scales the gradients made in the forward in place (a copy would double the head's gradient at
  // its peak), so the node's backward runs once: a second (retain_graph) is an error, not a
  // silently rescaled gradient.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!ctx->saved_data.count("used"),
                "the chunked head cross-entropy's backward runs once (it scales its gradients in "
                "place); compute the loss again instead of retaining its graph");
    ctx->saved_data["used"] = true;
    variable_list saved = ctx->get_saved_variables();
    variable_list result(9);
    if (!grads[0].defined()) return result;
    const at::Tensor& scale = grads[0];
    if (saved[0].defined()) result[0] = saved[0].mul_(scale.to(saved[0].scalar_type()));
    if (saved[1].defined()) {
      const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
      result[1] = saved[1].mul_(scale).to(dtype);
    }
    return result;
  }
};

}  // namespace

HeadLoss ChunkedHeadCrossEntropy(const at::Tensor& hidden, const at::Tensor& weight,
                                 const at::Tensor& targets, int64_t ignore_index, bool predictions,
                                 int64_t chunk_rows) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1) &&
                  targets.dim() == 1 && targets.size(0) == hidden.size(0),
              "chunked cross-entropy: hidden ", hidden.sizes(), ", weight ", weight.sizes(),
              " and targets ", targets.sizes(), " do not fit");
  HeadLoss result;
  // Counted where the targets are, never read here: with no target the loss is 0 / 1.
  result.count = targets.ne(ignore_index).sum();
  const at::Tensor divisor = result.count.clamp_min(1).to(at::kFloat);
  const bool grads = at::GradMode::is_enabled();
  const variable_list out = ChunkedCrossEntropyFunction::apply(
      hidden, weight, targets, ignore_index, divisor, predictions, grads && hidden.requires_grad(),
      grads && weight.requires_grad(), chunk_rows);
  result.loss = out[0];
  if (predictions) result.predicted = out[1];
  return result;
}

}  // namespace engine::transformer
