// The kernels run on LibTorch's threads (the library is built with OpenMP, as LibTorch's OpenMP
// backend needs), and give the same bits on one thread and on two.
#include "engine_kernels/parallel_threads.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "engine_kernels/causal_attention.h"
#include "engine_kernels/fused_adamw.h"
#include "engine_kernels/nf4.h"
#include "engine_kernels/swiglu.h"

namespace engine::kernels {
namespace {

// Runs `body` with LibTorch's intra-op threads set to `threads`, then restores them.
template <typename Body>
auto WithThreads(int threads, Body body) {
  const int before = at::get_num_threads();
  at::set_num_threads(threads);
  auto result = body();
  at::set_num_threads(before);
  return result;
}

TEST(ParallelThreadsTest, TheKernelsParallelForUsesLibTorchsThreadCount) {
  EXPECT_EQ(WithThreads(2, [] { return ParallelForThreads(64); }), 2);
  EXPECT_EQ(WithThreads(1, [] { return ParallelForThreads(64); }), 1);
}

TEST(ParallelThreadsTest, AThreadThatKeepsItsWorkToItselfOpensNoTeamWhileOthersStillDo) {
  const auto on_threads = [] {
    int before_keeping = 0, kept = 0, other = 0;
    std::thread helper([&] {
      before_keeping = ParallelForThreads(64);
      KeepIntraOpWorkOnThisThread();
      kept = ParallelForThreads(64);
      // ATen's own operations too: a reduction large enough for its parallel path.
      at::randn({1 << 20}).sum();
      kept = std::max(kept, ParallelForThreads(64));
    });
    helper.join();
    std::thread other_helper([&] { other = ParallelForThreads(64); });
    other_helper.join();
    return std::vector<int>{before_keeping, kept, other, ParallelForThreads(64)};
  };
  EXPECT_EQ(WithThreads(2, on_threads), (std::vector<int>{2, 1, 2, 2}));
}

TEST(ParallelThreadsTest, AttentionAndSwiGluGiveTheSameBitsOnOneAndTwoThreads) {
  at::manual_seed(5);
  const at::Tensor q = at::randn({2, 4, 70, 16}), k = at::randn({2, 2, 70, 16}),
                   v = at::randn({2, 2, 70, 16}), grad = at::randn({2, 4, 70, 16});
  const auto attention = [&] {
    const CausalAttentionOutput out = CausalAttentionForward(q, k, v, 0.25, 0);
    const CausalAttentionGrads grads = CausalAttentionBackward(grad, q, k, v, out, 0.25, 0);
    return std::vector<at::Tensor>{out.out, grads.q, grads.k, grads.v};
  };
  const std::vector<at::Tensor> one = WithThreads(1, attention), two = WithThreads(2, attention);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(at::equal(one[i], two[i])) << i;

  const at::Tensor gate = at::randn({300, 96}), up = at::randn({300, 96});
  const auto swiglu = [&] { return SwiGluForward(gate, up); };
  EXPECT_TRUE(at::equal(WithThreads(1, swiglu), WithThreads(2, swiglu)));
}

TEST(ParallelThreadsTest, Nf4AndTheFusedAdamWGiveTheSameBitsOnOneAndTwoThreads) {
  at::manual_seed(6);
  const at::Tensor weight = at::randn({300, 256});
  const auto dequantize = [&] {
    return DequantizeNf4(QuantizeNf4(weight, 64, /*double_quant=*/true), at::kBFloat16);
  };
  EXPECT_TRUE(at::equal(WithThreads(1, dequantize), WithThreads(2, dequantize)));

  const int64_t n = 100003;  // several tasks of the parallel loop, and a ragged end
  const at::Tensor master = at::randn({n}), grad = at::randn({n}).to(at::kBFloat16);
  const auto step = [&] {
    at::Tensor p = master.clone(), m = at::zeros({n}), v = at::zeros({n});
    at::Tensor low = at::empty({n}, at::kBFloat16);
    AdamWHyper hyper;
    hyper.lr = 0.01;
    hyper.step = 1;
    FusedAdamW(p, grad, m, v, hyper, /*grad_scale=*/0.5, low);
    return std::vector<at::Tensor>{p, m, v, low};
  };
  const std::vector<at::Tensor> one = WithThreads(1, step), two = WithThreads(2, step);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(at::equal(one[i], two[i])) << i;
}

}  // namespace
}  // namespace engine::kernels
