// Qwen2-VL's image processor, as transformers computes it: smart_resize to a multiple of
// patch_size x merge_size within [min_pixels, max_pixels], bicubic resampling, rescale and
// normalise (CLIP mean and std), the frame repeated to fill a temporal patch, and the patches in
// the order the vision tower reads them (each merged 2x2 group together). Two resamplers, as
// transformers 5 has two backends that give other pixels:
//   - torchvision (the default; transformers 5's Qwen2VLImageProcessor): LibTorch's own
//     antialiased uint8 bicubic, then one fused rescale-and-normalise in f32;
//   - Pillow (preprocessor_config.json's image_processor_type "Qwen2VLImageProcessorPil", what
//     transformers 5 falls back to without torchvision and transformers 4's default): Pillow's
//     integer bicubic (image_resize.h), rescale in f64 and normalise in f32.
//
//   ENGINE_ASSIGN_OR_RETURN(auto processor, Qwen2VlImageProcessor::Read(dir /
//   "preprocessor_config.json")); ENGINE_ASSIGN_OR_RETURN(ImageGrid grid, processor.GridFor(height,
//   width));  // from the header processor.TokensFor(grid);                       // <|image_pad|>
//   tokens the image takes ENGINE_ASSIGN_OR_RETURN(at::Tensor patches,
//   processor.Patches(rgb_image));
//
// Videos are what transformers' video processors make of a video's frames: Qwen2VLVideoProcessor
// takes every frame given; Qwen3VLVideoProcessor first samples them (SampledFrames: `fps` a second
// of the rate they were taken at, at least min_frames) and bounds their size with their count.
// Then every frame is resized to one size, normalised as images are by the torchvision backend,
// the last frame repeated to fill the last temporal patch, and the patches grouped as the image's
// are, frame pair by frame pair. Qwen3-VL's text gives each temporal patch its time
// (Timestamps). The settings come from video_preprocessor_config.json, or from
// preprocessor_config.json where there is none, as transformers falls back (ReadForVideos).
//
// Failure: a preprocessor_config.json key this engine does not implement (another resample filter,
// an unknown key) is refused naming the file and key; an image whose aspect ratio exceeds 200 or
// that cannot be brought within the pixel limits is an error naming its size. Immutable after
// Read; any thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "engine/image_file.h"
#include "engine/status.h"

namespace engine {

// The image processor's settings, as Hugging Face names the file.
inline constexpr char kImageProcessorFile[] = "preprocessor_config.json";
// The video processor's; where a directory has none, its preprocessor_config.json is read.
inline constexpr char kVideoProcessorFile[] = "video_preprocessor_config.json";

// Patches along time, height and width (the model's image_grid_thw).
struct ImageGrid {
  int64_t t = 0, h = 0, w = 0;
  int64_t patches() const { return t * h * w; }
};

class Qwen2VlImageProcessor {
 public:
  // transformers' defaults.
  Qwen2VlImageProcessor() = default;
  // preprocessor_config.json.
  static StatusOr<Qwen2VlImageProcessor> Read(const std::filesystem::path& path);
  // Which video processor, by its video_processor_type (without one: Qwen3-VL's when the file's
  // processor_class is Qwen3VLProcessor, as transformers picks by the model).
  enum class VideoKind { kQwen2Vl, kQwen3Vl };
  // That processor's defaults (frames of 128 to 768 merged patches' worth of pixels; Qwen3-VL's
  // with patches of 16, mean and std 0.5, and frames sampled 2 a second).
  static Qwen2VlImageProcessor VideoDefaults(VideoKind kind = VideoKind::kQwen2Vl);
  // A video processor: `path` names its file, or a model directory whose
  // video_preprocessor_config.json (or, where there is none, preprocessor_config.json) is read.
  // Refused, naming the file and key: another video processor than Qwen2-VL's and Qwen3-VL's,
  // frame sampling by Qwen2-VL's (do_sample_frames), num_frames beside Qwen3-VL's fps.
  static StatusOr<Qwen2VlImageProcessor> ReadForVideos(const std::filesystem::path& path);
  // The file ReadForVideos(path) reads.
  static std::filesystem::path VideoFileFor(const std::filesystem::path& path);

  // smart_resize: the size (height, width) an image of this size is resized to.
  StatusOr<std::pair<int64_t, int64_t>> ResizedSize(int64_t height, int64_t width) const;
  StatusOr<ImageGrid> GridFor(int64_t height, int64_t width) const;
  // Image tokens in the text: one per merged group of merge_size x merge_size patches.
  int64_t TokensFor(const ImageGrid& grid) const {
    return grid.patches() / (merge_size * merge_size);
  }
  // f32 [grid.patches(), 3 * temporal_patch_size * patch_size^2].
  StatusOr<at::Tensor> Patches(const RgbImage& image) const;
  // A video of `frames` frames of height x width pixels: t = frames / temporal_patch_size, rounded
  // up. An error for no frames, more than max_frames, or a size the pixel limits cannot take.
  StatusOr<ImageGrid> VideoGridFor(int64_t frames, int64_t height, int64_t width) const;
  // f32 [grid.patches(), patch_values()] of frames of one size (an error naming the first frame of
  // another size, or one CheckVideoFrame refuses).
  StatusOr<at::Tensor> VideoPatches(const std::vector<RgbImage>& frames) const;
  // The same for `count` frames read one at a time by `frame(i)`, each resized as it comes, so
  // that no more than one frame is held at its own size.
  StatusOr<at::Tensor> VideoPatches(int64_t count,
                                    const std::function<StatusOr<RgbImage>(int64_t)>& frame) const;
  // Frames with transparency (RGBA, LA) are refused: transformers' video processors composite it
  // on white (or cannot take such frames at all), which this engine does not do. Greyscale and
  // palette frames are converted to RGB as images are.
  static Status CheckVideoFrame(const RgbImage& frame);
  // The <|video_pad|> tokens a video of `grid` takes in the text, and how many tokens each becomes:
  // one pad for the whole video, or (Qwen3-VL, whose text times each temporal patch) one per
  // temporal patch.
  std::vector<int64_t> VideoPadTokens(const ImageGrid& grid) const;
  // The frames (indices) of a video of `total` frames taken `fps` a second that the processor
  // reads: all of them, or (sample_frames) transformers' uniform sample.
  std::vector<int64_t> SampledFrames(int64_t total, double fps) const;
  // Qwen3-VL: the time in seconds of each temporal patch of frames `indices` (the mean of its
  // first and last frame's), which its text shows as "<t seconds>" before the patch's tokens.
  std::vector<double> Timestamps(const std::vector<int64_t>& indices, double fps) const;
  // Values per patch (the vision tower's input width).
  int64_t patch_values() const { return 3 * temporal_patch_size * patch_size * patch_size; }

  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  bool do_resize = true;
  bool do_rescale = true;
  bool do_normalize = true;
  double rescale_factor = 1.0 / 255;
  std::array<double, 3> image_mean = {0.48145466, 0.4578275, 0.40821073};
  std::array<double, 3> image_std = {0.26862954, 0.26130258, 0.27577711};
  enum class Resampler { kTorchvision, kPillow };
  Resampler resampler = Resampler::kTorchvision;
  // Videos only.
  VideoKind video_kind = VideoKind::kQwen2Vl;
  bool sample_frames = false;  // do_sample_frames (Qwen3-VL)
  double sample_fps = 2;       // fps: frames sampled a second
  int64_t num_frames = 0;      // > 0: this many frames sampled instead
  int64_t min_frames = 4;      // sampled at least (as many as there are)
  int64_t max_frames = 768;    // more frames in one video are refused (Qwen3-VL: sampled at most)
  bool cap_pixels_per_frame = false;  // qwen-vl-utils' bound on a whole video's pixels
  int64_t max_video_tokens = 128000;  // the bound's budget, in tokens

 private:
  // f32 [3, height, width]: the image resized and normalised as each backend does.
  at::Tensor TorchvisionFrame(const RgbImage& image, int64_t height, int64_t width) const;
  at::Tensor PillowFrame(const RgbImage& image, int64_t height, int64_t width) const;
  // smart_resize within [min_pixels, pixel_limit]; `refuse_above`: an error when its result is
  // still above the limit (the image processor's check; the video processors keep it).
  StatusOr<std::pair<int64_t, int64_t>> ResizedWithin(int64_t height, int64_t width,
                                                      int64_t pixel_limit, bool refuse_above) const;
  // The largest frame (Qwen3-VL: all frames together) a video of `frames` frames may have.
  int64_t VideoMaxPixels(int64_t frames) const;
  // The size (height, width) a video's frames are resized to.
  StatusOr<std::pair<int64_t, int64_t>> ResizedFrames(int64_t frames, int64_t height,
                                                      int64_t width) const;
  // frames [T, 3, height, width] f32 -> the patches, in the vision tower's order.
  at::Tensor Patchify(const at::Tensor& frames, int64_t height, int64_t width) const;
};

}  // namespace engine
