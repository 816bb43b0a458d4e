// What a checkpoint and an export carry as video_preprocessor_config.json: the file the data read
// its video processor from, unless the preprocessor_config.json they carry already is that file.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/qwen2_vl_image_processor.h"
#include "testing/temp_dir.h"
#include "text/stage_tokenizer.h"

namespace engine {
namespace {

TEST(VideoProcessorToCarryTest, CarriesTheVideoProcessorTheImageProcessorDoesNotStandFor) {
  testing::TempDir dir;
  const auto image = dir.Write("images/preprocessor_config.json", "{}");
  const auto video = dir.Write("tokenizer/video_preprocessor_config.json", "{}");
  const auto other_image = dir.Write("tokenizer/preprocessor_config.json", "{}");
  // A video processor's own file is carried.
  EXPECT_EQ(VideoProcessorToCarry(video, image), video);
  // The image processor's file read for videos too: the carried preprocessor_config.json serves.
  EXPECT_TRUE(VideoProcessorToCarry(image, image).empty());
  EXPECT_TRUE(VideoProcessorToCarry(dir.path() / "images/../images/preprocessor_config.json", image)
                  .empty());
  // Another preprocessor_config.json (`images { processor }` elsewhere than the tokenizer's, whose
  // file the videos read) is carried, so that generation reads what training read.
  EXPECT_EQ(VideoProcessorToCarry(other_image, image), other_image);
  // Nothing to carry.
  EXPECT_TRUE(VideoProcessorToCarry(dir.path() / "missing.json", image).empty());
  EXPECT_TRUE(VideoProcessorToCarry({}, image).empty());
}

}  // namespace
}  // namespace engine
