// Videos of the three families compute what transformers computes: each family's fixture
// (tests/fixtures/hf/qwen2_vl_fixture.py, produce_videos) holds two clips of PNG frames (a cat of
// 84x56 and a rocket of 60x40), what transformers' video processor makes of them
// (video_preprocessor_config.json: Qwen2VLVideoProcessor takes every frame, padding an odd count
// with the last; Qwen3VLVideoProcessor samples 4 of the cat's 6 frames), the M-RoPE positions of
// get_rope_index (with second_per_grid_ts for Qwen2.5-VL: the frames' fps given as video_metadata),
// the tower's features of the videos and the logits of two conversations, one with an image before
// its video (Qwen3-VL's with each temporal patch's timestamp in the text).
//
// Tolerances: pixel values 1e-5 (the same ATen operations; f32 rounding of the fused
// normalisation); positions exact; features and logits fp32 1e-4 (max abs difference, logits at
// real tokens). The fixture's metadata records what the plausible mistakes move the logits by
// (every frame at the first's temporal position 1.7-2.6, second_per_grid_ts ignored 3.2).
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/image_batch.h"
#include "engine/image_file.h"
#include "engine/qwen2_vl_image_processor.h"
#include "engine/safetensors.h"
#include "qwen2_vl_model.h"
#include "qwen2_vl_positions.h"
#include "qwen_vl_fixture.h"

namespace engine::transformer {
namespace {

using ::testing::HasSubstr;
using testing_support::MaxDifferenceAtRealTokens;

struct VideoFixture {
  testing_support::QwenVlFixture model;
  std::shared_ptr<const safetensors::File> reference;
  std::filesystem::path dir;

  at::Tensor Get(const std::string& name) const { return *reference->Get(name); }
  // Row 0: the cat clip; row 1: the camera image, then the rocket clip.
  std::vector<ImageGrid> VideoGrids() const {
    return testing_support::GridsOf(Get("video_grid_thw"));
  }
  ImagesOfBatch Images() const {
    ImagesOfBatch images;
    images.pixel_values = Get("pixel_values");
    images.row_grids = {{}, testing_support::GridsOf(Get("image_grid_thw"))};
    return images;
  }
  double fps() const { return std::stod(reference->metadata().at("fps")); }
  // The frame files of clip `name`, in order.
  std::vector<std::filesystem::path> Frames(const std::string& name) const {
    std::vector<std::filesystem::path> frames;
    for (const auto& entry : std::filesystem::directory_iterator(dir / "videos" / name)) {
      frames.push_back(entry.path());
    }
    std::sort(frames.begin(), frames.end());
    return frames;
  }
  // Qwen2-VL's and Qwen3-VL's processors give no second_per_grid_ts: their positions do not read
  // them.
  ImagesOfBatch Videos() const {
    const auto grids = VideoGrids();
    ImagesOfBatch videos;
    videos.pixel_values = Get("pixel_values_videos");
    videos.row_grids = {{grids[0]}, {grids[1]}};
    const bool timed = reference->Get("second_per_grid_ts").ok();
    const at::Tensor seconds = timed ? Get("second_per_grid_ts") : at::ones({2});
    videos.row_seconds_per_grid = {{seconds[0].item<double>()}, {seconds[1].item<double>()}};
    return videos;
  }
};

VideoFixture LoadVideoFixture(const std::string& family) {
  VideoFixture f;
  f.model = testing_support::LoadQwenVlFixture(family);
  f.dir = testing_support::FixtureDir(family);
  auto reference = safetensors::File::Open(f.dir / "video_reference.safetensors");
  EXPECT_TRUE(reference.ok()) << reference.status().message();
  f.reference = *reference;
  return f;
}

class QwenVlVideoTest : public ::testing::TestWithParam<std::string> {};

TEST_P(QwenVlVideoTest, VideoProcessorEqualsTransformers) {
  const VideoFixture f = LoadVideoFixture(GetParam());
  auto processor = Qwen2VlImageProcessor::ReadForVideos(f.dir);
  ASSERT_TRUE(processor.ok()) << processor.status().message();
  const bool qwen3 = GetParam() == "qwen3_vl";
  const int64_t factor = qwen3 ? 32 : 28;
  EXPECT_EQ(processor->min_pixels, 2 * factor * factor);
  EXPECT_EQ(processor->max_pixels, (qwen3 ? 40 : 6) * factor * factor);
  std::vector<at::Tensor> patches;
  const std::vector<ImageGrid> expected_grids = f.VideoGrids();
  int clip = 0;
  for (const char* name : {"cat", "rocket"}) {
    const std::vector<std::filesystem::path> files = f.Frames(name);
    const std::vector<int64_t> kept =
        processor->SampledFrames(static_cast<int64_t>(files.size()), f.fps());
    if (qwen3 && std::string(name) == "cat") {
      EXPECT_EQ(kept, (std::vector<int64_t>{0, 2, 3, 5}));  // numpy's linspace, half to even
    }
    std::vector<RgbImage> frames;
    for (int64_t i : kept) {
      auto frame = ReadRgbImage(files[static_cast<size_t>(i)]);
      ASSERT_TRUE(frame.ok()) << frame.status().message();
      frames.push_back(std::move(*frame));
    }
    auto grid = processor->VideoGridFor(static_cast<int64_t>(frames.size()), frames[0].height,
                                        frames[0].width);
    ASSERT_TRUE(grid.ok()) << grid.status().message();
    const ImageGrid& want = expected_grids[static_cast<size_t>(clip++)];
    EXPECT_EQ(std::vector<int64_t>({grid->t, grid->h, grid->w}),
              std::vector<int64_t>({want.t, want.h, want.w}))
        << name;
    auto p = processor->VideoPatches(frames);
    ASSERT_TRUE(p.ok()) << p.status().message();
    patches.push_back(*p);
  }
  const at::Tensor ours = at::cat(patches), theirs = f.Get("pixel_values_videos");
  ASSERT_EQ(ours.sizes(), theirs.sizes());
  EXPECT_LE((ours - theirs).abs().max().item<double>(), 1e-5);
}

TEST_P(QwenVlVideoTest, PositionsEqualGetRopeIndex) {
  const VideoFixture f = LoadVideoFixture(GetParam());
  const Qwen2VlConfig& config = f.model.config;
  ImagesOfBatch images = f.Images(), videos = f.Videos();
  std::vector<RowVisuals> rows(2);
  for (size_t r = 0; r < 2; ++r) {
    rows[r].images = images.row_grids[r];
    rows[r].videos = videos.row_grids[r];
    if (config.vision.family == VisionFamily::kQwen3Vl) {  // a run of tokens per temporal patch
      const ImageGrid g = videos.row_grids[r][0];
      rows[r].videos.assign(static_cast<size_t>(g.t), ImageGrid{1, g.h, g.w});
    }
    const int64_t step = config.vision.tokens_per_second > 0
                             ? config.vision.tokens_per_second *
                                   static_cast<int64_t>(videos.row_seconds_per_grid[r][0])
                             : 1;
    rows[r].video_time_steps = {step};
  }
  auto positions = ComputeMultimodalPositions(f.Get("input_ids"), f.Get("attention_mask"), rows,
                                              config.image_token_id, config.video_token_id,
                                              config.vision.spatial_merge_size);
  ASSERT_TRUE(positions.ok()) << positions.status().message();
  const at::Tensor real = f.Get("attention_mask").to(at::kBool).unsqueeze(0).expand({3, -1, -1});
  EXPECT_TRUE(at::equal(positions->position_ids.masked_select(real),
                        f.Get("mrope_position_ids").masked_select(real)));
  const at::Tensor expected_next =
      f.Get("mrope_position_ids").masked_fill(real.logical_not(), 0).amax({0, 2}) + 1;
  for (size_t row = 0; row < positions->next.size(); ++row) {
    EXPECT_EQ(positions->next[row], expected_next[static_cast<int64_t>(row)].item<int64_t>());
  }
}

TEST_P(QwenVlVideoTest, VideoFeaturesAndLogitsEqualTransformers) {
  const VideoFixture f = LoadVideoFixture(GetParam());
  at::NoGradGuard no_grad;
  const at::Tensor features =
      f.model.module->visual->forward(f.Get("pixel_values_videos"), f.VideoGrids());
  ASSERT_EQ(features.sizes(), f.Get("video_features").sizes());
  EXPECT_LE((features - f.Get("video_features")).abs().max().item<double>(), 1e-4);
  const at::Tensor mask = f.Get("attention_mask");
  auto hidden = f.model.module->Hidden(f.Get("input_ids"), mask, f.Images(), f.Videos());
  ASSERT_TRUE(hidden.ok()) << hidden.status().message();
  EXPECT_LE(MaxDifferenceAtRealTokens(f.model.module->lm.Logits(*hidden), f.Get("logits"), mask),
            1e-4);
}

TEST_P(QwenVlVideoTest, VideoTokensThatDoNotMatchTheVideosAreRefused) {
  const VideoFixture f = LoadVideoFixture(GetParam());
  at::NoGradGuard no_grad;
  ImagesOfBatch videos = f.Videos();
  videos.row_grids[1].clear();  // row 1's video tokens without its video
  auto hidden =
      f.model.module->Hidden(f.Get("input_ids"), f.Get("attention_mask"), f.Images(), videos);
  ASSERT_FALSE(hidden.ok());
  EXPECT_THAT(hidden.status().message(), HasSubstr("video tokens but its 1 video(s) give"));
}

INSTANTIATE_TEST_SUITE_P(Families, QwenVlVideoTest,
                         ::testing::Values("qwen2_vl", "qwen2_5_vl", "qwen3_vl"));

}  // namespace
}  // namespace engine::transformer
