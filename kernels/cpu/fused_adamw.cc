#include "engine_kernels/fused_adamw.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <atomic>
#include <cmath>

#define ENGINE_SIMD_CLONES __attribute__((target_clones("avx2", "default")))

namespace engine::kernels {
namespace {

constexpr int64_t kGrain = 1 << 14;

struct Coefficients {
  float decay, b1, one_minus_b1, b2, one_minus_b2, inv_bias2_sqrt, eps, step_size, grad_scale;
};

template <typename G>
ENGINE_SIMD_CLONES void AdamWSpan(float* p, const G* g, float* m, float* v, int64_t n,
                                  Coefficients c) {
  for (int64_t i = 0; i < n; ++i) {
    const float grad = static_cast<float>(g[i]) * c.grad_scale;
    const float param = p[i] * c.decay;
    const float mi = m[i] * c.b1 + c.one_minus_b1 * grad;
    const float vi = v[i] * c.b2 + c.one_minus_b2 * grad * grad;
    m[i] = mi;
    v[i] = vi;
    p[i] = param - c.step_size * (mi / (std::sqrt(vi) * c.inv_bias2_sqrt + c.eps));
  }
}

template <typename L>
ENGINE_SIMD_CLONES void CopyDown(const float* p, L* low, int64_t n) {
  for (int64_t i = 0; i < n; ++i) low[i] = static_cast<L>(p[i]);
}

template <typename G>
ENGINE_SIMD_CLONES bool UnscaleSpan(G* g, int64_t n, float inverse) {
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float x = static_cast<float>(g[i]);
    finite &= std::isfinite(x);
    g[i] = static_cast<G>(x * inverse);
  }
  return finite;
}

template <typename G>
ENGINE_SIMD_CLONES bool FiniteSpan(const G* g, int64_t n) {
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) finite &= std::isfinite(static_cast<float>(g[i]));
  return finite;
}

bool IsLowOrF32(c10::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

}  // namespace

bool FusedAdamWSupports(const at::Tensor& master, const at::Tensor& grad) {
  return master.device().is_cpu() && grad.device().is_cpu() && master.scalar_type() == at::kFloat &&
         IsLowOrF32(grad.scalar_type()) && master.is_contiguous() && grad.is_contiguous() &&
         master.numel() == grad.numel();
}

void FusedAdamW(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& exp_avg,
                const at::Tensor& exp_avg_sq, const AdamWHyper& h, double grad_scale,
                const at::Tensor& low_precision_copy) {
  TORCH_CHECK(FusedAdamWSupports(master, grad),
              "FusedAdamW takes a contiguous f32 CPU master and an f32/bf16/f16 gradient of its "
              "size");
  for (const at::Tensor* slot : {&exp_avg, &exp_avg_sq}) {
    TORCH_CHECK(slot->scalar_type() == at::kFloat && slot->is_contiguous() &&
                    slot->numel() == master.numel() && slot->device().is_cpu(),
                "FusedAdamW's moments must be contiguous f32 CPU tensors of the master's size");
  }
  const bool copy = low_precision_copy.defined();
  if (copy) {
    TORCH_CHECK((low_precision_copy.scalar_type() == at::kBFloat16 ||
                 low_precision_copy.scalar_type() == at::kHalf) &&
                    low_precision_copy.is_contiguous() &&
                    low_precision_copy.numel() == master.numel(),
                "FusedAdamW's low-precision copy must be a contiguous bf16/f16 tensor of the "
                "master's size");
  }
  const double bias1 = 1 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bias2_sqrt = std::sqrt(1 - std::pow(h.beta2, static_cast<double>(h.step)));
  const Coefficients c{static_cast<float>(1 - h.lr * h.weight_decay),
                       static_cast<float>(h.beta1),
                       static_cast<float>(1 - h.beta1),
                       static_cast<float>(h.beta2),
                       static_cast<float>(1 - h.beta2),
                       static_cast<float>(1 / bias2_sqrt),
                       static_cast<float>(h.epsilon),
                       static_cast<float>(h.lr / bias1),
                       static_cast<float>(grad_scale)};
  float* p = master.data_ptr<float>();
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(), "FusedAdamW", [&] {
    const scalar_t* g = grad.data_ptr<scalar_t>();
    at::parallel_for(0, master.numel(), kGrain, [&](int64_t begin, int64_t end) {
      AdamWSpan(p + begin, g + begin, m + begin, v + begin, end - begin, c);
      if (!copy) return;
      if (low_precision_copy.scalar_type() == at::kBFloat16) {
        CopyDown(p + begin, low_precision_copy.data_ptr<c10::BFloat16>() + begin, end - begin);
      } else {
        CopyDown(p + begin, low_precision_copy.data_ptr<c10::Half>() + begin, end - begin);
      }
    });
  });
}

bool UnscaleAndCheckFinite(const at::Tensor& grad, double inverse_scale) {
  TORCH_CHECK(grad.device().is_cpu() && grad.is_contiguous() && IsLowOrF32(grad.scalar_type()),
              "UnscaleAndCheckFinite takes a contiguous f32/bf16/f16 CPU tensor");
  std::atomic<bool> finite{true};
  const float inverse = static_cast<float>(inverse_scale);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(), "Unscale", [&] {
    scalar_t* g = grad.data_ptr<scalar_t>();
    at::parallel_for(0, grad.numel(), kGrain, [&](int64_t begin, int64_t end) {
      if (!UnscaleSpan(g + begin, end - begin, inverse)) finite = false;
    });
  });
  return finite;
}

bool AllFinite(const at::Tensor& grad) {
  TORCH_CHECK(grad.device().is_cpu() && grad.is_contiguous() && IsLowOrF32(grad.scalar_type()),
              "AllFinite takes a contiguous f32/bf16/f16 CPU tensor");
  std::atomic<bool> finite{true};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(), "AllFinite", [&] {
    const scalar_t* g = grad.data_ptr<scalar_t>();
    at::parallel_for(0, grad.numel(), kGrain, [&](int64_t begin, int64_t end) {
      if (!FiniteSpan(g + begin, end - begin)) finite = false;
    });
  });
  return finite;
}

}  // namespace engine::kernels
