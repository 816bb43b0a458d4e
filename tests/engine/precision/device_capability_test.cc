#include "precision/device_capability.h"

#include <ATen/ops/ones.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/precision_context.h"
#include "engine/torch_compat.h"

namespace engine {
namespace {

// The probe must agree with what LibTorch does when asked directly: detect, don't assume.
TEST(DeviceCapabilityTest, CpuProbeMatchesLibTorch) {
  DeviceCapability cpu = ProbeDevice("cpu");
  EXPECT_EQ(cpu.device, "cpu");
  EXPECT_FALSE(cpu.cuda);
  EXPECT_FALSE(cpu.name.empty());

  bool fp16_products = true;
  try {
    at::Tensor a = at::ones({2, 2}, at::kHalf);
    (void)a.matmul(a);
  } catch (...) {
    fp16_products = false;
  }
  EXPECT_EQ(cpu.fp16, fp16_products);

  bool bf16_autocast = true;
  try {
    auto scope = PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16).Enter();
  } catch (...) {
    bf16_autocast = false;
  }
  EXPECT_EQ(cpu.bf16_autocast, bf16_autocast);

  std::string flag;
  EXPECT_EQ(cpu.bf16_fast, CpuHasBf16Hardware(&flag) && cpu.bf16);
  if (cpu.bf16_fast) {
    EXPECT_NE(cpu.name.find(flag), std::string::npos);
  }
  EXPECT_EQ(ProbeDevice("cpu").name, cpu.name) << "cached";
}

TEST(DeviceCapabilityTest, Describe) {
  DeviceCapability d;
  d.device = "cuda:1";
  d.name = "NVIDIA TITAN RTX";
  d.cuda = true;
  d.compute_capability = 75;
  EXPECT_EQ(d.Describe(), "cuda:1 NVIDIA TITAN RTX (sm_75)");
}

TEST(DeviceCapabilityTest, AnUnusableDeviceIsNamedWithTheReasonAndTheWayOut) {
  EXPECT_TRUE(CheckDeviceUsable("cpu").ok());
  if (compat::CudaAvailable() && compat::CudaDeviceCount() > 0) {
    EXPECT_TRUE(CheckDeviceUsable("cuda:0").ok()) << CheckDeviceUsable("cuda:0").message();
    return;
  }
  // Without a usable CUDA device, LibTorch's own error comes through, on one line.
  const Status s = CheckDeviceUsable("cuda:0");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), ::testing::StartsWith("device cuda:0 cannot be used: "));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("exclusive-process compute mode"));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("CUDA_VISIBLE_DEVICES"));
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace engine
