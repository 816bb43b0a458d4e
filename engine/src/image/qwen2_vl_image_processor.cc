#include "engine/qwen2_vl_image_processor.h"

#include <ATen/ATen.h>
#include <ATen/ops/_upsample_bicubic2d_aa.h>
#include <ATen/ops/from_blob.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/json_key_reader.h"
#include "engine/untrusted_file.h"
#include "image/image_resize.h"

namespace engine {
namespace {

// preprocessor_config.json keys that name things without changing the pixels.
const std::set<std::string> kNeutralKeys = {"processor_class", "feature_extractor_type",
                                            "do_convert_rgb"};
// The image_processor_type of transformers 5's PIL backend; any other name (Qwen2VLImageProcessor,
// 4.x's Qwen2VLImageProcessorFast) is processed as transformers 5 does by default.
constexpr char kPillowProcessorType[] = "Qwen2VLImageProcessorPil";
constexpr int kPilBicubic = 3;

constexpr char kQwen2VideoProcessorType[] = "Qwen2VLVideoProcessor";
constexpr char kQwen3VideoProcessorType[] = "Qwen3VLVideoProcessor";

// The kind a video processor's config names (video_processor_type; none: Qwen2-VL's, as a
// preprocessor_config.json read for videos is), or an error naming the key.
StatusOr<Qwen2VlImageProcessor::VideoKind> VideoKindOf(const nlohmann::json& json,
                                                       const std::string& where) {
  if (!json.is_object()) return Qwen2VlImageProcessor::VideoKind::kQwen2Vl;
  if (!json.contains("video_processor_type")) {
    // A preprocessor_config.json read for videos: transformers picks the video processor by the
    // model, which Qwen3-VL's hub files name as their processor_class.
    const auto named = json.find("processor_class");
    return named != json.end() && *named == "Qwen3VLProcessor"
               ? Qwen2VlImageProcessor::VideoKind::kQwen3Vl
               : Qwen2VlImageProcessor::VideoKind::kQwen2Vl;
  }
  if (json["video_processor_type"] == kQwen2VideoProcessorType) {
    return Qwen2VlImageProcessor::VideoKind::kQwen2Vl;
  }
  if (json["video_processor_type"] == kQwen3VideoProcessorType) {
    return Qwen2VlImageProcessor::VideoKind::kQwen3Vl;
  }
  return InvalidArgumentError(
      where + ": 'video_processor_type' " + json["video_processor_type"].dump() +
      " is not supported by this engine (supported: " + kQwen2VideoProcessorType + ", " +
      kQwen3VideoProcessorType + ")");
}

// The keys only a video processor has, into `p` (whose video_kind is set).
Status ReadVideoKeys(JsonKeyReader& keys, Qwen2VlImageProcessor* p) {
  keys.Take("video_processor_type");  // VideoKindOf read it
  keys.Take("image_processor_type");  // a preprocessor_config.json read for videos
  ENGINE_RETURN_IF_ERROR(keys.Bool("do_sample_frames", &p->sample_frames));
  if (p->sample_frames && p->video_kind == Qwen2VlImageProcessor::VideoKind::kQwen2Vl) {
    return keys.Error("do_sample_frames",
                      "is true; this engine samples no frames for Qwen2-VL's video processor: "
                      "it reads every frame a video names (give the frames to train on, and set "
                      "do_sample_frames false)");
  }
  const nlohmann::json& cap = keys.Take("cap_pixels_per_frame");
  if (!cap.is_null()) {
    if (!cap.is_boolean()) return keys.Error("cap_pixels_per_frame", "must be true or false");
    p->cap_pixels_per_frame = cap.get<bool>();
  }
  ENGINE_RETURN_IF_ERROR(keys.PositiveInt("max_video_tokens", &p->max_video_tokens));
  ENGINE_RETURN_IF_ERROR(keys.PositiveInt("max_frames", &p->max_frames));
  ENGINE_RETURN_IF_ERROR(keys.PositiveInt("min_frames", &p->min_frames));
  ENGINE_RETURN_IF_ERROR(keys.PositiveInt("num_frames", &p->num_frames));
  if (p->num_frames > 0 && p->sample_frames) {
    // transformers passes the processor's fps with it, and refuses the two together.
    return keys.Error("num_frames",
                      "and fps are exclusive in transformers' frame sampling, which always has an "
                      "fps (2 by default): leave num_frames out");
  }
  const nlohmann::json& fps = keys.Take("fps");
  if (!fps.is_null()) {
    if (!fps.is_number() || !(fps.get<double>() > 0)) {
      return keys.Error("fps", "must be a positive number, not " + fps.dump());
    }
    p->sample_fps = fps.get<double>();
  }
  // What the processor returns besides the pixels, not how it computes them.
  keys.MarkRead("return_metadata");
  keys.MarkRead("video_metadata");
  return Status::Ok();
}

// preprocessor_config.json (video: a video processor's) into `p`, every key read, neutral or
// refused.
Status ReadProcessorConfig(const nlohmann::json& json, const std::string& where, bool video,
                           Qwen2VlImageProcessor* p) {
  if (!json.is_object()) return InvalidArgumentError(where + " is not a JSON object");
  JsonKeyReader keys(json, where);
  // min_pixels and max_pixels win over size's shortest_edge and longest_edge, as in transformers.
  const nlohmann::json& size = keys.Take("size");
  if (!size.is_null()) {
    if (!size.is_object()) return keys.Error("size", "must be an object");
    JsonKeyReader edges(size, where + " size");
    ENGINE_RETURN_IF_ERROR(edges.PositiveInt("shortest_edge", &p->min_pixels));
    ENGINE_RETURN_IF_ERROR(edges.PositiveInt("longest_edge", &p->max_pixels));
    ENGINE_RETURN_IF_ERROR(edges.RefuseUnread({},
                                              "is not read by Qwen2-VL (it reads "
                                              "shortest_edge and longest_edge)"));
  }
  // Qwen3VLVideoProcessor reads its pixel limits from size alone; min_pixels and max_pixels (of a
  // preprocessor_config.json it falls back to) stay unread there, as in transformers.
  const bool limits_from_size_only =
      video && p->video_kind == Qwen2VlImageProcessor::VideoKind::kQwen3Vl;
  for (auto [key, value] : {std::pair<const char*, int64_t*>{"min_pixels", &p->min_pixels},
                            {"max_pixels", &p->max_pixels},
                            {"patch_size", &p->patch_size},
                            {"temporal_patch_size", &p->temporal_patch_size},
                            {"merge_size", &p->merge_size}}) {
    if (limits_from_size_only && std::string(key).find("pixels") != std::string::npos) {
      keys.Take(key);
      continue;
    }
    ENGINE_RETURN_IF_ERROR(keys.PositiveInt(key, value));
  }
  ENGINE_RETURN_IF_ERROR(keys.Bool("do_resize", &p->do_resize));
  ENGINE_RETURN_IF_ERROR(keys.Bool("do_rescale", &p->do_rescale));
  ENGINE_RETURN_IF_ERROR(keys.Bool("do_normalize", &p->do_normalize));
  const nlohmann::json& factor = keys.Take("rescale_factor");
  if (!factor.is_null()) {
    if (!factor.is_number() || !(factor.get<double>() > 0)) {
      return keys.Error("rescale_factor", "must be a positive number, not " + factor.dump());
    }
    p->rescale_factor = factor.get<double>();
  }
  for (auto [key, out] :
       {std::pair<const char*, std::array<double, 3>*>{"image_mean", &p->image_mean},
        {"image_std", &p->image_std}}) {
    const nlohmann::json& v = keys.Take(key);
    if (v.is_null()) continue;
    if (!v.is_array() || v.size() != 3 || !v[0].is_number() || !v[1].is_number() ||
        !v[2].is_number()) {
      return keys.Error(key, "must be 3 numbers, not " + v.dump());
    }
    for (size_t c = 0; c < 3; ++c) (*out)[c] = v[c].get<double>();
  }
  if (video) {
    ENGINE_RETURN_IF_ERROR(ReadVideoKeys(keys, p));
  } else if (const nlohmann::json& type = keys.Take("image_processor_type");
             type.is_string() && type.get<std::string>() == kPillowProcessorType) {
    p->resampler = Qwen2VlImageProcessor::Resampler::kPillow;
  }
  const nlohmann::json& resample = keys.Take("resample");
  if (!resample.is_null() && resample != kPilBicubic) {
    return keys.Error("resample",
                      resample.dump() + " is not supported by this engine (supported: 3, bicubic)");
  }
  ENGINE_RETURN_IF_ERROR(keys.RefuseUnread(
      kNeutralKeys, video ? "is not supported by this engine's Qwen2-VL video processor"
                          : "is not supported by this engine's Qwen2-VL image processor"));
  if (p->patch_size > 1024 || p->temporal_patch_size > 64 || p->merge_size > 64 ||
      p->max_pixels > (int64_t{1} << 40) || p->max_frames > 65536 || p->min_frames > 65536 ||
      p->num_frames > 65536 || p->max_video_tokens > (int64_t{1} << 30)) {
    return InvalidArgumentError(where +
                                ": patch_size, temporal_patch_size, merge_size, "
                                "max_pixels, max_frames, min_frames, num_frames or "
                                "max_video_tokens above the largest this engine reads (1024, 64, "
                                "64, 2^40, 65536, 65536, 65536, 2^30)");
  }
  if (p->min_pixels > p->max_pixels) {
    return InvalidArgumentError(where + ": min_pixels " + std::to_string(p->min_pixels) +
                                " is above max_pixels " + std::to_string(p->max_pixels));
  }
  for (double s : p->image_std) {
    if (!(s > 0)) return keys.Error("image_std", "must be positive numbers");
  }
  return Status::Ok();
}

std::string ImageSizeText(int64_t height, int64_t width) {
  return std::to_string(width) + "x" + std::to_string(height);
}

// An image processor's file, or a video processor's (starting from its kind's defaults).
StatusOr<Qwen2VlImageProcessor> ReadFrom(const std::filesystem::path& path, bool video) {
  ENGINE_ASSIGN_OR_RETURN(std::string text, ReadUntrustedFile(path, FileKind::kConfig));
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return InvalidArgumentError("'" + path.string() + "' is not valid JSON");
  const std::string where = "'" + path.string() + "'";
  Qwen2VlImageProcessor processor;
  if (video) {
    ENGINE_ASSIGN_OR_RETURN(Qwen2VlImageProcessor::VideoKind kind, VideoKindOf(json, where));
    processor = Qwen2VlImageProcessor::VideoDefaults(kind);
  }
  ENGINE_RETURN_IF_ERROR(ReadProcessorConfig(json, where, video, &processor));
  return processor;
}

// numpy.linspace(0, last, count) rounded half to even, as the video processors sample frames.
std::vector<int64_t> EvenlySpaced(int64_t last, int64_t count) {
  std::vector<int64_t> out;
  const double step = count > 1 ? static_cast<double>(last) / static_cast<double>(count - 1) : 0;
  for (int64_t i = 0; i < count; ++i) {
    const double at =
        i + 1 == count && count > 1 ? static_cast<double>(last) : static_cast<double>(i) * step;
    out.push_back(static_cast<int64_t>(std::nearbyint(at)));
  }
  return out;
}

}  // namespace

StatusOr<Qwen2VlImageProcessor> Qwen2VlImageProcessor::Read(const std::filesystem::path& path) {
  return ReadFrom(path, /*video=*/false);
}

Qwen2VlImageProcessor Qwen2VlImageProcessor::VideoDefaults(VideoKind kind) {
  Qwen2VlImageProcessor p;
  p.video_kind = kind;
  p.min_pixels = 128 * 28 * 28;
  p.max_pixels = 768 * 28 * 28;
  if (kind == VideoKind::kQwen3Vl) {
    p.patch_size = 16;
    p.min_pixels = 128 * 32 * 32;
    p.max_pixels = 768 * 32 * 32;
    p.image_mean = {0.5, 0.5, 0.5};
    p.image_std = {0.5, 0.5, 0.5};
    p.sample_frames = true;
    p.max_video_tokens = 768;
  }
  return p;
}

std::filesystem::path Qwen2VlImageProcessor::VideoFileFor(const std::filesystem::path& path) {
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) return path;
  const std::filesystem::path videos = path / kVideoProcessorFile;
  return std::filesystem::exists(videos, error) ? videos : path / kImageProcessorFile;
}

StatusOr<Qwen2VlImageProcessor> Qwen2VlImageProcessor::ReadForVideos(
    const std::filesystem::path& path) {
  return ReadFrom(VideoFileFor(path), /*video=*/true);
}

StatusOr<std::pair<int64_t, int64_t>> Qwen2VlImageProcessor::ResizedSize(int64_t height,
                                                                         int64_t width) const {
  return ResizedWithin(height, width, max_pixels, /*refuse_above=*/true);
}

StatusOr<std::pair<int64_t, int64_t>> Qwen2VlImageProcessor::ResizedWithin(
    int64_t height, int64_t width, int64_t pixel_limit, bool refuse_above) const {
  const int64_t factor = patch_size * merge_size;
  if (!do_resize) {
    if (height % factor != 0 || width % factor != 0) {
      return InvalidArgumentError("an image of " + ImageSizeText(height, width) +
                                  " pixels is not a multiple of " + std::to_string(factor) +
                                  " on each side, and do_resize is false");
    }
    return std::make_pair(height, width);
  }
  const double h = static_cast<double>(height), w = static_cast<double>(width);
  if (std::max(h, w) / std::min(h, w) > 200) {
    return InvalidArgumentError("an image of " + ImageSizeText(height, width) +
                                " pixels has an aspect ratio above 200, which Qwen2-VL refuses");
  }
  // Python's round: half to even, as nearbyint does in the default rounding mode.
  auto h_bar = static_cast<int64_t>(std::nearbyint(h / factor)) * factor;
  auto w_bar = static_cast<int64_t>(std::nearbyint(w / factor)) * factor;
  if (h_bar * w_bar > pixel_limit) {
    const double beta = std::sqrt(h * w / static_cast<double>(pixel_limit));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / factor)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / factor)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / factor)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / factor)) * factor;
  }
  if (h_bar <= 0 || w_bar <= 0 || (refuse_above && h_bar * w_bar > pixel_limit)) {
    return InvalidArgumentError("an image of " + ImageSizeText(height, width) +
                                " pixels cannot be resized to multiples of " +
                                std::to_string(factor) + " within min_pixels " +
                                std::to_string(min_pixels) + " and max_pixels " +
                                std::to_string(pixel_limit));
  }
  return std::make_pair(h_bar, w_bar);
}

StatusOr<ImageGrid> Qwen2VlImageProcessor::GridFor(int64_t height, int64_t width) const {
  ENGINE_ASSIGN_OR_RETURN(auto size, ResizedSize(height, width));
  return ImageGrid{1, size.first / patch_size, size.second / patch_size};
}

at::Tensor Qwen2VlImageProcessor::TorchvisionFrame(const RgbImage& image, int64_t height,
                                                   int64_t width) const {
  // The same ATen operations torchvision and transformers run, in their order, so the values
  // are LibTorch's own.
  at::Tensor frame = at::from_blob(const_cast<uint8_t*>(image.pixels.data()),
                                   {1, image.height, image.width, 3}, at::kByte)
                         .permute({0, 3, 1, 2});
  if (height != image.height || width != image.width) {
    frame = at::_upsample_bicubic2d_aa(frame.contiguous(), {height, width},
                                       /*align_corners=*/false);
  }
  frame = frame.squeeze(0);
  const auto channel_vector = [](const std::array<double, 3>& v) {
    return at::tensor(
               {static_cast<float>(v[0]), static_cast<float>(v[1]), static_cast<float>(v[2])})
        .view({3, 1, 1});
  };
  if (do_normalize) {
    // transformers fuses the rescale into the mean and std (divided by the factor, in f32).
    at::Tensor mean = channel_vector(image_mean), std = channel_vector(image_std);
    if (do_rescale) {
      mean = mean * (1.0 / rescale_factor);
      std = std * (1.0 / rescale_factor);
    }
    return frame.to(at::kFloat).sub(mean).div_(std);
  }
  if (do_rescale) return frame * rescale_factor;
  return frame.to(at::kFloat);
}

at::Tensor Qwen2VlImageProcessor::PillowFrame(const RgbImage& image, int64_t height,
                                              int64_t width) const {
  std::vector<uint8_t> resized;
  if (height != image.height || width != image.width) {
    resized = ResizeBicubicLikePillow(image.pixels, image.width, image.height, width, height);
  }
  const std::vector<uint8_t>& pixels = resized.empty() ? image.pixels : resized;
  // transformers' PIL backend rescales in f64 and stores f32, then normalises in f32.
  std::vector<float> values(pixels.size());
  for (size_t i = 0; i < pixels.size(); ++i) {
    float v =
        do_rescale ? static_cast<float>(pixels[i] * rescale_factor) : static_cast<float>(pixels[i]);
    if (do_normalize) {
      const size_t c = i % 3;
      v = (v - static_cast<float>(image_mean[c])) / static_cast<float>(image_std[c]);
    }
    values[i] = v;
  }
  return at::from_blob(values.data(), {height, width, 3}, at::kFloat)
      .permute({2, 0, 1})
      .clone(at::MemoryFormat::Contiguous);  // owns its memory: `values` goes
}

StatusOr<at::Tensor> Qwen2VlImageProcessor::Patches(const RgbImage& image) const {
  ENGINE_ASSIGN_OR_RETURN(auto size, ResizedSize(image.height, image.width));
  const auto [height, width] = size;
  const at::Tensor frame = resampler == Resampler::kTorchvision
                               ? TorchvisionFrame(image, height, width)
                               : PillowFrame(image, height, width);
  // The one frame repeated temporal_patch_size times.
  return Patchify(frame.unsqueeze(0).expand({temporal_patch_size, 3, height, width}), height,
                  width);
}

at::Tensor Qwen2VlImageProcessor::Patchify(const at::Tensor& frames, int64_t height,
                                           int64_t width) const {
  // Grouped as (t, h/m, w/m, m, m) patches of (C, T, p, p) values.
  const int64_t p = patch_size, m = merge_size, gh = height / p, gw = width / p;
  const int64_t t = frames.size(0) / temporal_patch_size;
  return frames.reshape({t, temporal_patch_size, 3, gh / m, m, p, gw / m, m, p})
      .permute({0, 3, 6, 4, 7, 2, 1, 5, 8})
      .reshape({t * gh * gw, patch_values()})
      .contiguous();
}

int64_t Qwen2VlImageProcessor::VideoMaxPixels(int64_t frames) const {
  if (!cap_pixels_per_frame) return max_pixels;
  const int64_t factor = patch_size * merge_size;
  const auto at_least = static_cast<int64_t>(static_cast<double>(min_pixels) * 1.05);
  if (video_kind == VideoKind::kQwen3Vl) {
    // Qwen3-VL's bound on all the frames together: each at most max_video_tokens tokens' pixels
    // and its share of max_pixels, at least 1.05 x min_pixels.
    return std::max(std::min(max_video_tokens * factor * factor, max_pixels / frames), at_least) *
           frames;
  }
  // qwen-vl-utils' bound, as transformers writes it: 90% of max_video_tokens tokens' pixels shared
  // by the frames (counted in temporal patches' worth), at least 1.05 x min_pixels per frame.
  const auto total =
      static_cast<int64_t>(static_cast<double>(max_video_tokens) * factor * factor * 0.9);
  return std::max(std::min(max_pixels, total * temporal_patch_size / frames), at_least);
}

StatusOr<std::pair<int64_t, int64_t>> Qwen2VlImageProcessor::ResizedFrames(int64_t frames,
                                                                           int64_t height,
                                                                           int64_t width) const {
  if (video_kind == VideoKind::kQwen2Vl || !do_resize) {
    // The video processor keeps what smart_resize gives, even past a capped limit.
    return ResizedWithin(height, width, VideoMaxPixels(frames), /*refuse_above=*/false);
  }
  // Qwen3-VL's smart_resize: frames smaller than a merged patch scaled up first, then the pixels
  // of all frames (rounded to whole temporal patches) kept within the limits.
  const int64_t factor = patch_size * merge_size;
  const int64_t pixel_limit = VideoMaxPixels(frames);
  double h = static_cast<double>(height), w = static_cast<double>(width);
  if (h < factor || w < factor) {
    const double scale = std::max(factor / h, factor / w);
    h = std::trunc(h * scale);
    w = std::trunc(w * scale);
  }
  if (std::max(h, w) / std::min(h, w) > 200) {
    return InvalidArgumentError("frames of " + ImageSizeText(height, width) +
                                " pixels have an aspect ratio above 200, which Qwen3-VL refuses");
  }
  const auto t = static_cast<double>(frames);
  auto h_bar = static_cast<int64_t>(std::nearbyint(h / factor)) * factor;
  auto w_bar = static_cast<int64_t>(std::nearbyint(w / factor)) * factor;
  const auto t_bar =
      static_cast<int64_t>(std::nearbyint(t / static_cast<double>(temporal_patch_size))) *
      temporal_patch_size;
  if (t_bar * h_bar * w_bar > pixel_limit) {
    const double beta = std::sqrt(t * h * w / static_cast<double>(pixel_limit));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / factor)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / factor)) * factor);
  } else if (t_bar * h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (t * h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / factor)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / factor)) * factor;
  }
  return std::make_pair(h_bar, w_bar);
}

StatusOr<ImageGrid> Qwen2VlImageProcessor::VideoGridFor(int64_t frames, int64_t height,
                                                        int64_t width) const {
  const int64_t fewest = video_kind == VideoKind::kQwen3Vl ? temporal_patch_size : 1;
  if (frames < fewest || frames > max_frames) {
    return InvalidArgumentError("a video of " + std::to_string(frames) +
                                " frames; this video processor reads " + std::to_string(fewest) +
                                " to max_frames " + std::to_string(max_frames));
  }
  ENGINE_ASSIGN_OR_RETURN(auto size, ResizedFrames(frames, height, width));
  const int64_t t = (frames + temporal_patch_size - 1) / temporal_patch_size;
  return ImageGrid{t, size.first / patch_size, size.second / patch_size};
}

std::vector<int64_t> Qwen2VlImageProcessor::VideoPadTokens(const ImageGrid& grid) const {
  if (video_kind != VideoKind::kQwen3Vl) return {TokensFor(grid)};
  return std::vector<int64_t>(static_cast<size_t>(grid.t), TokensFor(ImageGrid{1, grid.h, grid.w}));
}

std::vector<int64_t> Qwen2VlImageProcessor::SampledFrames(int64_t total, double fps) const {
  if (!sample_frames) return EvenlySpaced(total - 1, total);
  int64_t count = num_frames;
  if (count <= 0) {
    // transformers' Qwen3-VL: int(total / fps * sample_fps), at least min_frames, at most
    // max_frames and the frames there are; a video of unknown rate counts as 24 a second.
    const double rate = fps > 0 ? fps : 24;
    count = static_cast<int64_t>(static_cast<double>(total) / rate * sample_fps);
    count = std::min({std::max(count, min_frames), max_frames, total});
  }
  return EvenlySpaced(total - 1, count);
}

std::vector<double> Qwen2VlImageProcessor::Timestamps(const std::vector<int64_t>& indices,
                                                      double fps) const {
  if (!(fps > 0)) fps = 24;  // a video of unknown rate, as transformers counts it
  std::vector<int64_t> padded = indices;
  while (!padded.empty() && padded.size() % static_cast<size_t>(temporal_patch_size) != 0) {
    padded.push_back(padded.back());
  }
  std::vector<double> out;
  for (size_t i = 0; i < padded.size(); i += static_cast<size_t>(temporal_patch_size)) {
    const double first = static_cast<double>(padded[i]) / fps;
    const double last =
        static_cast<double>(padded[i + static_cast<size_t>(temporal_patch_size) - 1]) / fps;
    out.push_back((first + last) / 2);
  }
  return out;
}

Status Qwen2VlImageProcessor::CheckVideoFrame(const RgbImage& frame) {
  if (frame.source_mode == "RGBA" || frame.source_mode == "LA") {
    return InvalidArgumentError("a video frame with transparency (" + frame.source_mode +
                                "): transformers' video processors composite it on white, which "
                                "this engine does not do; give RGB frames");
  }
  return Status::Ok();
}

StatusOr<at::Tensor> Qwen2VlImageProcessor::VideoPatches(
    const std::vector<RgbImage>& frames) const {
  return VideoPatches(static_cast<int64_t>(frames.size()), [&](int64_t i) -> StatusOr<RgbImage> {
    return frames[static_cast<size_t>(i)];
  });
}

StatusOr<at::Tensor> Qwen2VlImageProcessor::VideoPatches(
    int64_t count, const std::function<StatusOr<RgbImage>(int64_t)>& frame) const {
  if (count < 1) return InvalidArgumentError("a video without frames");
  at::Tensor resized;  // [temporal patches x temporal_patch_size, 3, height, width]
  int64_t first_height = 0, first_width = 0;
  ImageGrid grid;
  for (int64_t i = 0; i < count; ++i) {
    ENGINE_ASSIGN_OR_RETURN(RgbImage image, frame(i));
    ENGINE_RETURN_IF_ERROR(CheckVideoFrame(image).WithContext("frame " + std::to_string(i + 1)));
    if (i == 0) {
      first_height = image.height;
      first_width = image.width;
      ENGINE_ASSIGN_OR_RETURN(grid, VideoGridFor(count, image.height, image.width));
      resized = at::empty(
          {grid.t * temporal_patch_size, 3, grid.h * patch_size, grid.w * patch_size}, at::kFloat);
    } else if (image.height != first_height || image.width != first_width) {
      return InvalidArgumentError(
          "frame " + std::to_string(i + 1) + " is " + ImageSizeText(image.height, image.width) +
          " pixels where frame 1 is " + ImageSizeText(first_height, first_width) +
          "; a video's frames have one size");
    }
    // The video processor resizes and normalises as the image processor's torchvision backend
    // does.
    resized[i].copy_(TorchvisionFrame(image, grid.h * patch_size, grid.w * patch_size));
  }
  // The last frame repeated to fill the last temporal patch.
  for (int64_t i = count; i < resized.size(0); ++i) resized[i].copy_(resized[count - 1]);
  return Patchify(resized, grid.h * patch_size, grid.w * patch_size);
}

}  // namespace engine
