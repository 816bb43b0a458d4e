#include "engine_kernels/fused_adamw.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#if defined(ENGINE_KERNELS_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "engine_kernels/fused_adamw_cuda.h"
#endif
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu_kernel_support.h"
#include "engine_kernels/adamw_coefficients.h"

#define ENGINE_SIMD_CLONES __attribute__((target_clones("avx2", "default")))

namespace engine::kernels {
namespace {

constexpr int64_t kGrain = 1 << 14;

template <typename G>
ENGINE_SIMD_CLONES void AdamWSpan(float* p, const G* g, float* m, float* v, int64_t n,
                                  AdamWCoefficients c) {
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

// The exponent bits of each floating type: a value is inf or nan exactly when all are set. Testing
// them on the raw bits vectorises to a few integer instructions per lane; std::isfinite on the
// converted value does not, and ran at half of memcpy's bandwidth, a pass over every gradient
// each step.
template <typename G>
struct ExponentBits;
template <>
struct ExponentBits<float> {
  using Bits = uint32_t;
  static constexpr Bits kMask = 0x7f800000u;
};
template <>
struct ExponentBits<c10::BFloat16> {
  using Bits = uint16_t;
  static constexpr Bits kMask = 0x7f80u;
};
template <>
struct ExponentBits<c10::Half> {
  using Bits = uint16_t;
  static constexpr Bits kMask = 0x7c00u;
};
template <>
struct ExponentBits<double> {
  using Bits = uint64_t;
  static constexpr Bits kMask = 0x7ff0000000000000ull;
};

template <typename G>
ENGINE_SIMD_CLONES bool FiniteSpan(const G* g, int64_t n) {
  using Bits = typename ExponentBits<G>::Bits;
  constexpr Bits kMask = ExponentBits<G>::kMask;
  static_assert(sizeof(Bits) == sizeof(G), "the bits are the value's own");
  Bits non_finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits bits;
    std::memcpy(&bits, g + i, sizeof(Bits));
    non_finite |= static_cast<Bits>((bits & kMask) == kMask);
  }
  return non_finite == 0;
}

template <typename G>
ENGINE_SIMD_CLONES bool UnscaleSpan(G* g, int64_t n, float inverse) {
  using Bits = typename ExponentBits<G>::Bits;
  constexpr Bits kMask = ExponentBits<G>::kMask;
  Bits non_finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits bits;
    std::memcpy(&bits, g + i, sizeof(Bits));
    non_finite |= static_cast<Bits>((bits & kMask) == kMask);
    g[i] = static_cast<G>(static_cast<float>(g[i]) * inverse);
  }
  return non_finite == 0;
}

// Where the kernels run: the CPU, and CUDA devices where this build wires the CUDA kernels in.
bool OnKernelDevice(const at::Tensor& t) {
#if defined(ENGINE_KERNELS_WITH_CUDA)
  if (t.is_cuda()) return true;
#endif
  return t.device().is_cpu();
}

AdamWCoefficients CoefficientsOf(const AdamWHyper& h, double grad_scale) {
  const double bias1 = 1 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bias2_sqrt = std::sqrt(1 - std::pow(h.beta2, static_cast<double>(h.step)));
  return {static_cast<float>(1 - h.lr * h.weight_decay),
          static_cast<float>(h.beta1),
          static_cast<float>(1 - h.beta1),
          static_cast<float>(h.beta2),
          static_cast<float>(1 - h.beta2),
          static_cast<float>(1 / bias2_sqrt),
          static_cast<float>(h.epsilon),
          static_cast<float>(h.lr / bias1),
          static_cast<float>(grad_scale)};
}

#if defined(ENGINE_KERNELS_WITH_CUDA)
KernelDtype KernelDtypeOf(const at::Tensor& t) {
  if (!t.defined()) return KernelDtype::kNone;
  switch (t.scalar_type()) {
    case at::kFloat:
      return KernelDtype::kF32;
    case at::kBFloat16:
      return KernelDtype::kBF16;
    case at::kHalf:
      return KernelDtype::kF16;
    default:
      TORCH_CHECK(false, "the fused kernels take f32, bf16 or f16, not ", t.scalar_type());
  }
}
#endif

// Scans grad for non-finite values (unscaling it in place when `unscale`); true when all finite.
bool ScanOnCpu(const at::Tensor& grad, bool unscale, double inverse_scale) {
  std::atomic<bool> finite{true};
  const float inverse = static_cast<float>(inverse_scale);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(), "Scan", [&] {
    scalar_t* g = grad.data_ptr<scalar_t>();
    at::parallel_for(0, grad.numel(), kGrain, [&](int64_t begin, int64_t end) {
      const bool ok = unscale ? UnscaleSpan(g + begin, end - begin, inverse)
                              : FiniteSpan(g + begin, end - begin);
      if (!ok) finite = false;
    });
  });
  return finite;
}

void CheckFlag(const at::Tensor& grad, const at::Tensor& found_nonfinite) {
  TORCH_CHECK(found_nonfinite.scalar_type() == at::kInt && found_nonfinite.numel() == 1 &&
                  found_nonfinite.device() == grad.device(),
              "the non-finite flag must be one int32 on the gradient's device");
}

void Scan(const at::Tensor& grad, bool unscale, double inverse_scale,
          const at::Tensor& found_nonfinite) {
  TORCH_CHECK(FusedKernelsTake(grad),
              "the non-finite check takes a contiguous f32/bf16/f16 tensor on a device the "
              "kernels run on (the CPU, and CUDA where LibTorch has it)");
  CheckFlag(grad, found_nonfinite);
#if defined(ENGINE_KERNELS_WITH_CUDA)
  if (grad.is_cuda()) {
    const c10::cuda::CUDAGuard guard(grad.device());
    const int rc =
        cuda::FlagNonFinite(grad.data_ptr(), KernelDtypeOf(grad), grad.numel(), unscale,
                            static_cast<float>(inverse_scale), found_nonfinite.data_ptr<int>(),
                            at::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(rc == 0, "the CUDA non-finite check failed to launch (cudaError ", rc, ")");
    return;
  }
#endif
  if (!ScanOnCpu(grad, unscale, inverse_scale)) *found_nonfinite.data_ptr<int>() = 1;
}

}  // namespace

bool FusedKernelsTake(const at::Tensor& grad) {
  return grad.defined() && OnKernelDevice(grad) && grad.is_contiguous() &&
         IsLowOrF32(grad.scalar_type());
}

bool FusedAdamWSupports(const at::Tensor& master, const at::Tensor& grad) {
  return OnKernelDevice(master) && grad.device() == master.device() &&
         master.scalar_type() == at::kFloat && IsLowOrF32(grad.scalar_type()) &&
         master.is_contiguous() && grad.is_contiguous() && master.numel() == grad.numel();
}

void FusedAdamW(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& exp_avg,
                const at::Tensor& exp_avg_sq, const AdamWHyper& h, double grad_scale,
                const at::Tensor& low_precision_copy) {
  TORCH_CHECK(FusedAdamWSupports(master, grad),
              "FusedAdamW takes a contiguous f32 master and an f32/bf16/f16 gradient of its size "
              "on one device");
  for (const at::Tensor* slot : {&exp_avg, &exp_avg_sq}) {
    TORCH_CHECK(slot->scalar_type() == at::kFloat && slot->is_contiguous() &&
                    slot->numel() == master.numel() && slot->device() == master.device(),
                "FusedAdamW's moments must be contiguous f32 tensors of the master's size, on its "
                "device");
  }
  const bool copy = low_precision_copy.defined();
  if (copy) {
    TORCH_CHECK((low_precision_copy.scalar_type() == at::kBFloat16 ||
                 low_precision_copy.scalar_type() == at::kHalf) &&
                    low_precision_copy.is_contiguous() &&
                    low_precision_copy.numel() == master.numel() &&
                    low_precision_copy.device() == master.device(),
                "FusedAdamW's low-precision copy must be a contiguous bf16/f16 tensor of the "
                "master's size, on its device");
  }
  const AdamWCoefficients c = CoefficientsOf(h, grad_scale);
  float* p = master.data_ptr<float>();
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
#if defined(ENGINE_KERNELS_WITH_CUDA)
  if (master.is_cuda()) {
    const c10::cuda::CUDAGuard guard(master.device());
    const int rc = cuda::FusedAdamW(p, grad.data_ptr(), KernelDtypeOf(grad), m, v, master.numel(),
                                    c, copy ? low_precision_copy.data_ptr() : nullptr,
                                    KernelDtypeOf(low_precision_copy),
                                    at::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(rc == 0, "the CUDA fused AdamW failed to launch (cudaError ", rc, ")");
    return;
  }
#endif
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
  TORCH_CHECK(grad.device().is_cpu() && FusedKernelsTake(grad),
              "UnscaleAndCheckFinite takes a contiguous f32/bf16/f16 CPU tensor");
  return ScanOnCpu(grad, /*unscale=*/true, inverse_scale);
}

bool AllFinite(const at::Tensor& grad) {
  TORCH_CHECK(grad.device().is_cpu() && FusedKernelsTake(grad),
              "AllFinite takes a contiguous f32/bf16/f16 CPU tensor");
  return ScanOnCpu(grad, /*unscale=*/false, 1.0);
}

void UnscaleAndFlagNonFinite(const at::Tensor& grad, double inverse_scale,
                             const at::Tensor& found_nonfinite) {
  Scan(grad, /*unscale=*/true, inverse_scale, found_nonfinite);
}

void FlagNonFinite(const at::Tensor& grad, const at::Tensor& found_nonfinite) {
  Scan(grad, /*unscale=*/false, 1.0, found_nonfinite);
}

}  // namespace engine::kernels
