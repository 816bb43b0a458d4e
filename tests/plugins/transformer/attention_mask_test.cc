// The decoder's attention mask and positions: causal, padded, and packed rows whose mask numbers
// the examples 1, 2, ... so that each sees only itself and counts its positions from 0.
#include "attention_mask.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

namespace engine::transformer {
namespace {

const at::Device kCpu(at::kCPU);

at::Tensor Row(std::vector<int64_t> values) { return at::tensor(values, at::kLong).unsqueeze(0); }

// The mask as allowed[query][key] (true where attention IS allowed).
std::vector<std::vector<bool>> Allowed(const at::Tensor& masked) {
  const at::Tensor m = masked.squeeze(0).squeeze(0);
  std::vector<std::vector<bool>> allowed(m.size(0), std::vector<bool>(m.size(1)));
  for (int64_t q = 0; q < m.size(0); ++q) {
    for (int64_t k = 0; k < m.size(1); ++k) allowed[q][k] = !m[q][k].item<bool>();
  }
  return allowed;
}

TEST(AttentionMaskTest, PaddedRowsAreCausalAndNeverSeePadding) {
  const at::Tensor padding = Row({0, 1, 1, 1});
  EXPECT_TRUE(PositionIds(padding, 4, 0, kCpu).equal(Row({0, 0, 1, 2})));
  const auto allowed = Allowed(BuildAttentionMask(padding, 4, 0, 0, kCpu));
  const std::vector<std::vector<bool>> expected = {{false, false, false, false},
                                                   {false, true, false, false},
                                                   {false, true, true, false},
                                                   {false, true, true, true}};
  EXPECT_EQ(allowed, expected);
}

TEST(AttentionMaskTest, PackedExamplesSeeOnlyThemselvesAndCountFromZero) {
  // Two examples and a padding position.
  const at::Tensor segments = Row({1, 1, 2, 2, 2, 0});
  // (A padding position's own position changes nothing: no real token sees it.)
  EXPECT_TRUE(PositionIds(segments, 6, 0, kCpu).narrow(1, 0, 5).equal(Row({0, 1, 0, 1, 2})));
  const auto allowed = Allowed(BuildAttentionMask(segments, 6, 0, 0, kCpu));
  const std::vector<std::vector<bool>> expected = {
      {true, false, false, false, false, false},
      {true, true, false, false, false, false},
      {false, false, true, false, false, false},
      {false, false, true, true, false, false},
      {false, false, true, true, true, false},
      // Padding keeps the plain causal mask, so that no row is fully masked.
      {true, true, true, true, true, false}};
  EXPECT_EQ(allowed, expected);
}

TEST(AttentionMaskTest, PackedRowsMayBeLeftPaddedAndZeroOneMasksMayHaveHoles) {
  EXPECT_TRUE(PositionIds(Row({0, 0, 1, 1, 2, 2}), 6, 0, kCpu).equal(Row({0, 0, 0, 1, 0, 1})));
  // A 0/1 mask counts every real token of its row, padding between them included.
  EXPECT_TRUE(PositionIds(Row({1, 0, 1, 1}), 4, 0, kCpu).equal(Row({0, 0, 1, 2})));
  // The last position of a cached step.
  EXPECT_TRUE(PositionIds(Row({0, 1, 1, 1}), 1, 3, kCpu).equal(Row({2})));
}

TEST(AttentionMaskTest, APackedRowWithASlidingWindowKeepsBoth) {
  const at::Tensor segments = Row({1, 1, 1, 2, 2, 2});
  const auto allowed = Allowed(BuildAttentionMask(segments, 6, 0, 2, kCpu));
  // Window 2: a query sees itself and the key before it, within its own example.
  EXPECT_TRUE(allowed[2][1] && allowed[2][2] && !allowed[2][0]);
  EXPECT_TRUE(allowed[3][3] && !allowed[3][2]);
  EXPECT_TRUE(allowed[5][4] && allowed[5][5] && !allowed[5][3]);
}

}  // namespace
}  // namespace engine::transformer
