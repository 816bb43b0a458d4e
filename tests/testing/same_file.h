// Bit-for-bit comparison of two safetensors files, for tests that prove a resumed or distributed
// run ends exactly where an uninterrupted one does.
#pragma once

#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/safetensors.h"

namespace engine::testing {

// Every tensor (name, dtype, values) and every metadata entry of `actual` equals `expected`'s.
inline void ExpectSameSafetensors(const std::filesystem::path& expected,
                                  const std::filesystem::path& actual) {
  auto a = safetensors::File::Open(expected);
  auto b = safetensors::File::Open(actual);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ((*a)->metadata(), (*b)->metadata()) << actual;
  ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size()) << actual;
  for (const safetensors::TensorInfo& info : (*a)->tensors()) {
    auto x = (*a)->Get(info.name);
    auto y = (*b)->Get(info.name);
    ASSERT_TRUE(x.ok() && y.ok()) << info.name;
    EXPECT_EQ(x->scalar_type(), y->scalar_type()) << info.name;
    EXPECT_TRUE(at::equal(*x, *y)) << info.name << " differs in " << actual;
  }
}

}  // namespace engine::testing
