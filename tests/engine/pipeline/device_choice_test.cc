// parallel.device resolved against given CUDA devices: one device per DDP local rank (F9).
#include "pipeline/device_choice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace engine {
namespace {

using ::testing::HasSubstr;

CudaDevices Gpus(int count, bool visible_devices_set = false) {
  return CudaDevices{count > 0, count, "2.11.0", visible_devices_set};
}

TEST(DeviceChoiceTest, WithoutDdpAutoTakesTheFirstDeviceOrTheCpu) {
  EXPECT_EQ(ChooseDeviceAmong("auto", Gpus(0), std::nullopt)->device, "cpu");
  EXPECT_EQ(ChooseDeviceAmong("auto", Gpus(0), std::nullopt)->reason,
            "auto: no CUDA device (LibTorch 2.11.0)");
  EXPECT_EQ(ChooseDeviceAmong("auto", Gpus(4), std::nullopt)->device, "cuda:0");
  EXPECT_EQ(ChooseDeviceAmong("cuda", Gpus(4), std::nullopt)->device, "cuda:0");
  EXPECT_EQ(ChooseDeviceAmong("cuda:3", Gpus(4), std::nullopt)->device, "cuda:3");
  EXPECT_THAT(ChooseDeviceAmong("cuda:4", Gpus(4), std::nullopt).status().message(),
              HasSubstr("'cuda:4' does not exist: 4 CUDA device(s) are visible"));
  EXPECT_THAT(ChooseDeviceAmong("cuda", Gpus(0), std::nullopt).status().message(),
              HasSubstr("has no CUDA support or sees no CUDA device"));
  for (const char* bad : {"tpu", "cuda:", "cuda:x", "cuda:-1", "cuda:99999"}) {
    EXPECT_THAT(ChooseDeviceAmong(bad, Gpus(2), std::nullopt).status().message(),
                HasSubstr("is not a device"))
        << bad;
  }
}

TEST(DeviceChoiceTest, EveryDdpLocalRankTakesItsOwnDevice) {
  for (int rank = 0; rank < 4; ++rank) {
    for (const char* requested : {"auto", "cuda"}) {
      auto choice = ChooseDeviceAmong(requested, Gpus(4), RankPlacement{rank, 8});
      ASSERT_TRUE(choice.ok()) << choice.status().message();
      EXPECT_EQ(choice->device, "cuda:" + std::to_string(rank));
      EXPECT_THAT(choice->reason, HasSubstr("this rank's own device (LOCAL_RANK=" +
                                            std::to_string(rank) + ", 4 CUDA device(s))"));
    }
  }
  // CPU ranks stay on the CPU.
  EXPECT_EQ(ChooseDeviceAmong("auto", Gpus(0), RankPlacement{3, 4})->device, "cpu");
  EXPECT_EQ(ChooseDeviceAmong("cpu", Gpus(4), RankPlacement{3, 4})->device, "cpu");
}

TEST(DeviceChoiceTest, ARankWithoutADeviceOrRanksSharingOneAreRefused) {
  const Status missing = ChooseDeviceAmong("auto", Gpus(2), RankPlacement{2, 3}).status();
  EXPECT_EQ(missing.message(),
            "parallel.device 'auto': this rank has LOCAL_RANK=2, but only 2 CUDA device(s) are "
            "visible and every local rank needs its own; start at most 2 ranks per machine, or "
            "use \"cpu\"");
  const Status shared = ChooseDeviceAmong("cuda:1", Gpus(2), RankPlacement{0, 2}).status();
  EXPECT_THAT(shared.message(),
              HasSubstr("'cuda:1' would put all 2 ranks on one device; under DDP each rank takes "
                        "its own (cuda:LOCAL_RANK): write \"cuda\" or \"auto\""));
  // One rank in all may name its device.
  EXPECT_EQ(ChooseDeviceAmong("cuda:1", Gpus(2), RankPlacement{0, 1})->device, "cuda:1");
}

TEST(DeviceChoiceTest, ARankGivenOneDeviceThroughCudaVisibleDevicesTakesIt) {
  // A scheduler that sets CUDA_VISIBLE_DEVICES per rank: every rank sees its device as cuda:0.
  auto choice =
      ChooseDeviceAmong("auto", Gpus(1, /*visible_devices_set=*/true), RankPlacement{3, 4});
  ASSERT_TRUE(choice.ok()) << choice.status().message();
  EXPECT_EQ(choice->device, "cuda:0");
  EXPECT_EQ(choice->reason,
            "auto: the one device CUDA_VISIBLE_DEVICES gives this rank (LOCAL_RANK=3)");
  // Without it, two local ranks on a one-GPU machine would share that GPU.
  EXPECT_THAT(ChooseDeviceAmong("auto", Gpus(1), RankPlacement{1, 2}).status().message(),
              HasSubstr("LOCAL_RANK=1, but only 1 CUDA device(s) are visible"));
}

}  // namespace
}  // namespace engine
