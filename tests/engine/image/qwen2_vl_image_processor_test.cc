// Images read and processed as transformers' Qwen2VLImageProcessor processes them: the qwen2_vl
// fixture (tests/fixtures/hf/qwen2_vl_fixture.py) holds four real photographs (RGB PNG, JPEG,
// greyscale PNG, RGBA PNG with transparent corners) and the pixel_values and image_grid_thw
// transformers 5.17's own processors made of them, with both backends: torchvision (the default)
// and Pillow (min_pixels 1568, max_pixels 4704).
//
// Tolerance: none, except one image on the Pillow path. The torchvision path runs LibTorch's own
// resampling and normalisation on the pixels libjpeg-turbo and libpng decode (as Pillow does), so
// its values are bit-identical for all four images. The Pillow path reproduces the integer
// arithmetic of Debian's Pillow 9.4 byte for byte (bit-identical to transformers 4.51's values,
// the fixture's earlier references), and Pillow 13 from PyPI still gives the same bytes for the
// three PNG images; for rocket.jpg (60x40 to 56x28) it resamples differently, by up to 2 levels of
// an 8-bit pixel: Pillow13Tolerance. For scale: one level is 0.015 after normalisation, and
// compositing the logo's alpha on white instead of dropping it moves a value by 3.8.
#include "engine/qwen2_vl_image_processor.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/image_file.h"
#include "engine/image_tokens.h"
#include "engine/safetensors.h"
#include "image/image_resize.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

// `levels` levels of an 8-bit pixel after normalisation (1 / 255 / the smallest std each).
double Pillow13Tolerance(const Qwen2VlImageProcessor& processor, int levels) {
  return levels / 255.0 /
             *std::min_element(processor.image_std.begin(), processor.image_std.end()) +
         1e-6;
}

std::filesystem::path FixtureDir(const std::string& family) {
  return std::filesystem::path(testing::kSourceDir) / "tests" / "fixtures" / "hf" / family;
}
const std::filesystem::path kFixture = FixtureDir("qwen2_vl");

struct ProcessorReference {
  at::Tensor pixel_values, pixel_values_pil, image_grid_thw, input_ids;
  std::vector<std::string> images;
};

ProcessorReference ReadReference(const std::string& family) {
  auto file = safetensors::File::Open(FixtureDir(family) / "reference.safetensors");
  EXPECT_TRUE(file.ok()) << file.status().message();
  ProcessorReference r;
  r.pixel_values = *(*file)->Get("pixel_values");
  r.pixel_values_pil = *(*file)->Get("pixel_values_pil");
  r.image_grid_thw = *(*file)->Get("image_grid_thw");
  r.input_ids = *(*file)->Get("input_ids");
  r.images =
      nlohmann::json::parse((*file)->metadata().at("images")).get<std::vector<std::string>>();
  return r;
}

Qwen2VlImageProcessor FixtureProcessor(const std::string& family = "qwen2_vl") {
  auto processor = Qwen2VlImageProcessor::Read(FixtureDir(family) / "preprocessor_config.json");
  EXPECT_TRUE(processor.ok()) << processor.status().message();
  return *processor;
}

TEST(ImageFileTest, ReadsPngAndJpegWithTheirModes) {
  struct Expected {
    const char* name;
    int64_t width, height;
    const char* mode;
  };
  for (const Expected& e :
       {Expected{"chelsea.png", 84, 56, "RGB"}, Expected{"rocket.jpg", 60, 40, "RGB"},
        Expected{"camera.png", 70, 70, "L"}, Expected{"logo.png", 30, 30, "RGBA"}}) {
    SCOPED_TRACE(e.name);
    auto image = ReadRgbImage(kFixture / "images" / e.name);
    ASSERT_TRUE(image.ok()) << image.status().message();
    EXPECT_EQ(image->width, e.width);
    EXPECT_EQ(image->height, e.height);
    EXPECT_EQ(image->source_mode, e.mode);
    EXPECT_EQ(image->pixels.size(), static_cast<size_t>(e.width * e.height * 3));
    // Decoded from bytes in memory, the same image.
    const auto path = kFixture / "images" / e.name;
    auto from_bytes = DecodeRgbImage(testing::ReadText(path), path);
    ASSERT_TRUE(from_bytes.ok()) << from_bytes.status().message();
    EXPECT_EQ(from_bytes->pixels, image->pixels);
  }
  // Greyscale is repeated into the three channels; the logo's transparent corner keeps its black.
  auto camera = ReadRgbImage(kFixture / "images" / "camera.png");
  for (size_t i = 0; i < camera->pixels.size(); i += 3) {
    ASSERT_EQ(camera->pixels[i], camera->pixels[i + 1]);
    ASSERT_EQ(camera->pixels[i], camera->pixels[i + 2]);
  }
  auto logo = ReadRgbImage(kFixture / "images" / "logo.png");
  EXPECT_EQ(logo->pixels[0] + logo->pixels[1] + logo->pixels[2], 0);
}

TEST(ImageFileTest, BadFilesAreErrorsNamingTheFile) {
  testing::TempDir dir;
  const std::string png = testing::ReadText(kFixture / "images" / "chelsea.png");
  const std::string jpeg = testing::ReadText(kFixture / "images" / "rocket.jpg");
  struct Case {
    std::string name, content, message;
  };
  for (const Case& c :
       {Case{"text.png", "not an image at all", "is neither a PNG nor a JPEG file"},
        Case{"empty.jpg", "", "is empty"},
        Case{"half.png", png.substr(0, png.size() / 2), "is not a readable PNG file"},
        Case{"header_only.png", png.substr(0, 40), "is not a readable PNG file"},
        Case{"half.jpg", jpeg.substr(0, jpeg.size() / 2), "is truncated"},
        Case{"header_only.jpg", jpeg.substr(0, 3), "is not a readable JPEG file"}}) {
    SCOPED_TRACE(c.name);
    const auto path = dir.Write(c.name, c.content);
    for (auto image : {ReadRgbImage(path), DecodeRgbImage(c.content, path)}) {
      ASSERT_FALSE(image.ok());
      EXPECT_THAT(image.status().message(), HasSubstr("image '" + path.string() + "'"));
      EXPECT_THAT(image.status().message(), HasSubstr(c.message));
    }
  }
  auto missing = ReadRgbImage(dir.path() / "missing.png");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("cannot open '" + (dir.path() / "missing.png").string() + "'"));
}

// The family fixture's images through the engine's processor, read from the fixture's
// preprocessor_config.json, against transformers' pixel_values and grids: bit for bit, but for
// rocket.jpg through Pillow, within `pillow_levels` levels of an 8-bit pixel.
void ExpectPixelValuesAndGridsOfTransformers(const std::string& family, int pillow_levels) {
  const ProcessorReference reference = ReadReference(family);
  for (const auto resampler : {Qwen2VlImageProcessor::Resampler::kTorchvision,
                               Qwen2VlImageProcessor::Resampler::kPillow}) {
    const bool torchvision = resampler == Qwen2VlImageProcessor::Resampler::kTorchvision;
    SCOPED_TRACE(torchvision ? "torchvision" : "Pillow");
    Qwen2VlImageProcessor processor = FixtureProcessor(family);
    EXPECT_EQ(processor.resampler, Qwen2VlImageProcessor::Resampler::kTorchvision);
    processor.resampler = resampler;
    const at::Tensor pixel_values =
        torchvision ? reference.pixel_values : reference.pixel_values_pil;
    int64_t start = 0, image_tokens = 0;
    for (size_t i = 0; i < reference.images.size(); ++i) {
      SCOPED_TRACE(reference.images[i]);
      auto image = ReadRgbImage(FixtureDir(family) / reference.images[i]);
      ASSERT_TRUE(image.ok()) << image.status().message();
      auto grid = processor.GridFor(image->height, image->width);
      ASSERT_TRUE(grid.ok()) << grid.status().message();
      const at::Tensor expected_grid = reference.image_grid_thw[static_cast<int64_t>(i)];
      EXPECT_EQ(grid->t, expected_grid[0].item<int64_t>());
      EXPECT_EQ(grid->h, expected_grid[1].item<int64_t>());
      EXPECT_EQ(grid->w, expected_grid[2].item<int64_t>());
      auto patches = processor.Patches(*image);
      ASSERT_TRUE(patches.ok()) << patches.status().message();
      ASSERT_EQ(patches->sizes(),
                (std::vector<int64_t>{grid->patches(), processor.patch_values()}));
      const at::Tensor expected = pixel_values.narrow(0, start, grid->patches());
      if (torchvision || reference.images[i] != "images/rocket.jpg") {
        EXPECT_TRUE(at::equal(*patches, expected));
      } else {
        EXPECT_LE((*patches - expected).abs().max().item<double>(),
                  Pillow13Tolerance(processor, pillow_levels));
      }
      start += grid->patches();
      image_tokens += processor.TokensFor(*grid);
    }
    EXPECT_EQ(start, pixel_values.size(0));
    // <|image_pad|> (id 264) appears once per merged 2x2 group.
    EXPECT_EQ(image_tokens, reference.input_ids.eq(264).sum().item<int64_t>());
  }
}

TEST(Qwen2VlImageProcessorTest, PixelValuesAndGridsEqualTransformers) {
  ExpectPixelValuesAndGridsOfTransformers("qwen2_vl", 2);
}

// Qwen3-VL's hub directories set patches of 16 pixels (smart_resize to multiples of 32) and mean
// and std 0.5 in the same processor. Pillow 13 resamples rocket.jpg (60x40 to 64x32) up to 4 levels
// of an 8-bit pixel away from Pillow 9.4's arithmetic, which the engine's Pillow path keeps.
TEST(Qwen2VlImageProcessorTest, Qwen3VlPixelValuesAndGridsEqualTransformers) {
  const Qwen2VlImageProcessor processor = FixtureProcessor("qwen3_vl");
  EXPECT_EQ(processor.patch_size, 16);
  EXPECT_EQ(processor.image_std, (std::array<double, 3>{0.5, 0.5, 0.5}));
  ExpectPixelValuesAndGridsOfTransformers("qwen3_vl", 4);
}

TEST(Qwen2VlImageProcessorTest, PreprocessorConfigNamesTheBackend) {
  testing::TempDir dir;
  nlohmann::json json =
      nlohmann::json::parse(testing::ReadText(kFixture / "preprocessor_config.json"));
  for (const auto& [type, resampler] :
       {std::pair<const char*, Qwen2VlImageProcessor::Resampler>{
            "Qwen2VLImageProcessor", Qwen2VlImageProcessor::Resampler::kTorchvision},
        {"Qwen2VLImageProcessorFast", Qwen2VlImageProcessor::Resampler::kTorchvision},
        {"Qwen2VLImageProcessorPil", Qwen2VlImageProcessor::Resampler::kPillow}}) {
    json["image_processor_type"] = type;
    auto read = Qwen2VlImageProcessor::Read(dir.Write("preprocessor_config.json", json.dump()));
    ASSERT_TRUE(read.ok()) << read.status().message();
    EXPECT_EQ(read->resampler, resampler) << type;
  }
}

TEST(Qwen2VlImageProcessorTest, SmartResizeRoundsAsPythonAndKeepsThePixelLimits) {
  Qwen2VlImageProcessor p;  // transformers' defaults: 3136 to 1003520 pixels, factor 28
  auto size = [&](int64_t h, int64_t w) { return *p.ResizedSize(h, w); };
  EXPECT_EQ(size(70, 70), std::make_pair(int64_t{56}, int64_t{56}));    // 2.5 rounds to even
  EXPECT_EQ(size(98, 98), std::make_pair(int64_t{112}, int64_t{112}));  // 3.5 rounds to even
  EXPECT_EQ(size(10, 10), std::make_pair(int64_t{56}, int64_t{56}));    // scaled up to min_pixels
  const auto large = size(4000, 3000);
  EXPECT_LE(large.first * large.second, p.max_pixels);
  EXPECT_EQ(large.first % 28, 0);
  EXPECT_EQ(large.second % 28, 0);
  auto thin = p.ResizedSize(10, 2010);
  ASSERT_FALSE(thin.ok());
  EXPECT_THAT(thin.status().message(), HasSubstr("2010x10 pixels has an aspect ratio above 200"));
  p.max_pixels = 28 * 28;
  auto too_wide = p.ResizedSize(28, 1000);
  ASSERT_FALSE(too_wide.ok());
  EXPECT_THAT(too_wide.status().message(), HasSubstr("within min_pixels 3136 and max_pixels 784"));
}

TEST(Qwen2VlImageProcessorTest, ResizeIsPillowsAcrossScales) {
  // Up and down by several factors: constant images stay constant (the taps sum to one) and a
  // same-size resize is a copy.
  std::vector<uint8_t> grey(17 * 23 * 3, 77);
  for (auto [w, h] : {std::pair<int64_t, int64_t>{5, 7}, {46, 34}, {17, 23}, {90, 3}}) {
    const auto out = ResizeBicubicLikePillow(grey, 17, 23, w, h);
    ASSERT_EQ(out.size(), static_cast<size_t>(w * h * 3));
    for (uint8_t v : out) ASSERT_EQ(v, 77);
  }
  std::vector<uint8_t> ramp(8 * 8 * 3);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(ResizeBicubicLikePillow(ramp, 8, 8, 8, 8), ramp);
}

TEST(Qwen2VlImageProcessorTest, PreprocessorConfigKeysAreReadOrRefusedByName) {
  const Qwen2VlImageProcessor p = FixtureProcessor();
  EXPECT_EQ(p.min_pixels, 1568);
  EXPECT_EQ(p.max_pixels, 4704);
  EXPECT_EQ(p.patch_values(), 1176);
  testing::TempDir dir;
  nlohmann::json json =
      nlohmann::json::parse(testing::ReadText(kFixture / "preprocessor_config.json"));
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* message;
  };
  for (const Case& c : {Case{"resample", 2, "'resample' 2 is not supported by this engine"},
                        Case{"do_pad", true, "'do_pad' (true) is not supported"},
                        Case{"image_mean", {0.5, 0.5}, "'image_mean' must be 3 numbers"},
                        Case{"min_pixels", 9999, "min_pixels 9999 is above max_pixels 4704"}}) {
    SCOPED_TRACE(c.key);
    nlohmann::json changed = json;
    changed[c.key] = c.value;
    const auto path = dir.Write("preprocessor_config.json", changed.dump());
    auto read = Qwen2VlImageProcessor::Read(path);
    ASSERT_FALSE(read.ok());
    EXPECT_THAT(read.status().message(), HasSubstr(path.string()));
    EXPECT_THAT(read.status().message(), HasSubstr(c.message));
  }
}

// A video processor is read from video_preprocessor_config.json, else (as transformers falls back)
// preprocessor_config.json, starting from its kind's defaults; what this engine cannot do is
// refused naming the file and key.
TEST(Qwen2VlImageProcessorTest, VideoProcessorsAreReadWithTheirKindsDefaults) {
  testing::TempDir dir;
  dir.Write("preprocessor_config.json", R"({"min_pixels": 3136, "max_pixels": 12845056})");
  auto fallback = Qwen2VlImageProcessor::ReadForVideos(dir.path());
  ASSERT_TRUE(fallback.ok()) << fallback.status().message();
  EXPECT_EQ(fallback->min_pixels, 3136);
  EXPECT_EQ(fallback->video_kind, Qwen2VlImageProcessor::VideoKind::kQwen2Vl);
  EXPECT_FALSE(fallback->sample_frames);
  // Qwen3-VL's hub preprocessor_config.json names its processor, by which transformers picks
  // Qwen3VLVideoProcessor; that one reads its limits from size alone.
  testing::TempDir qwen3_dir;
  qwen3_dir.Write("preprocessor_config.json",
                  R"({"processor_class": "Qwen3VLProcessor", "min_pixels": 3136})");
  auto by_class = Qwen2VlImageProcessor::ReadForVideos(qwen3_dir.path());
  ASSERT_TRUE(by_class.ok()) << by_class.status().message();
  EXPECT_EQ(by_class->video_kind, Qwen2VlImageProcessor::VideoKind::kQwen3Vl);
  EXPECT_EQ(by_class->min_pixels, 128 * 32 * 32);
  dir.Write("video_preprocessor_config.json",
            R"({"video_processor_type": "Qwen3VLVideoProcessor"})");
  auto qwen3 = Qwen2VlImageProcessor::ReadForVideos(dir.path());
  ASSERT_TRUE(qwen3.ok()) << qwen3.status().message();
  EXPECT_EQ(qwen3->video_kind, Qwen2VlImageProcessor::VideoKind::kQwen3Vl);
  EXPECT_EQ(qwen3->patch_size, 16);
  EXPECT_EQ(qwen3->min_pixels, 128 * 32 * 32);
  EXPECT_TRUE(qwen3->sample_frames);
  EXPECT_EQ(qwen3->image_mean[0], 0.5);
  for (const auto& [json, message] :
       {std::pair<const char*, const char*>{
            R"({"video_processor_type": "Qwen2VLVideoProcessor", "do_sample_frames": true})",
            "'do_sample_frames' is true; this engine samples no frames for Qwen2-VL's"},
        {R"({"video_processor_type": "LlavaNextVideoProcessor"})",
         "'video_processor_type' \"LlavaNextVideoProcessor\" is not supported"},
        {R"({"video_processor_type": "Qwen3VLVideoProcessor", "fps": 0})",
         "'fps' must be a positive number, not 0"},
        {R"({"video_processor_type": "Qwen3VLVideoProcessor", "num_frames": 8})",
         "'num_frames' and fps are exclusive"},
        {R"({"crop_size": 224})",
         "'crop_size' (224) is not supported by this engine's Qwen2-VL video"}}) {
    SCOPED_TRACE(json);
    auto refused =
        Qwen2VlImageProcessor::ReadForVideos(dir.Write("video_preprocessor_config.json", json));
    ASSERT_FALSE(refused.ok());
    EXPECT_THAT(refused.status().message(), HasSubstr("video_preprocessor_config.json"));
    EXPECT_THAT(refused.status().message(), HasSubstr(message));
  }
}

// Qwen3-VL's frame sampling and timestamps as transformers 5.17 computes them (values from its
// Qwen3VLVideoProcessor.sample_frames and Qwen3VLProcessor on frames with video_metadata).
TEST(Qwen2VlImageProcessorTest, Qwen3VlSamplesFramesAndTimesTheirPatchesAsTransformers) {
  Qwen2VlImageProcessor p =
      Qwen2VlImageProcessor::VideoDefaults(Qwen2VlImageProcessor::VideoKind::kQwen3Vl);
  // 7 frames at 2 a second: all kept; 0..6 padded with 6, pairs averaged.
  EXPECT_EQ(p.SampledFrames(7, 2), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p.Timestamps(p.SampledFrames(7, 2), 2), (std::vector<double>{0.25, 1.25, 2.25, 3.0}));
  EXPECT_EQ(Qwen3VideoText({0.25, 3.0}),
            "<|vision_start|><0.2 seconds><|vision_start|><|video_pad|><|vision_end|>"
            "<3.0 seconds><|vision_start|><|video_pad|><|vision_end|><|vision_end|>");
  // int(6 / 4 * 2) = 3, at least min_frames 4: linspace(0, 5, 4) = 0, 1.67, 3.33, 5.
  EXPECT_EQ(p.SampledFrames(6, 4), (std::vector<int64_t>{0, 2, 3, 5}));
  // 300 frames at 30 a second: 20 frames, spread over the whole video.
  const std::vector<int64_t> long_video = p.SampledFrames(300, 30);
  ASSERT_EQ(long_video.size(), 20u);
  EXPECT_EQ(long_video.front(), 0);
  EXPECT_EQ(long_video.back(), 299);
  // Fewer frames than min_frames: all of them; one frame is too few for a temporal patch.
  EXPECT_EQ(p.SampledFrames(3, 2), (std::vector<int64_t>{0, 1, 2}));
  auto one = p.VideoGridFor(1, 64, 64);
  ASSERT_FALSE(one.ok());
  EXPECT_THAT(one.status().message(),
              HasSubstr("a video of 1 frames; this video processor reads 2"));
  // Qwen2-VL's processor reads every frame.
  EXPECT_EQ(Qwen2VlImageProcessor::VideoDefaults().SampledFrames(5, 30).size(), 5u);
}

}  // namespace
}  // namespace engine
