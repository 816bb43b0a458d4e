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

// preprocessor_config.json into `p`, every key read, neutral or refused.
Status ReadProcessorConfig(const nlohmann::json& json, const std::string& where,
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
  for (auto [key, value] : {std::pair<const char*, int64_t*>{"min_pixels", &p->min_pixels},
                            {"max_pixels", &p->max_pixels},
                            {"patch_size", &p->patch_size},
                            {"temporal_patch_size", &p->temporal_patch_size},
                            {"merge_size", &p->merge_size}}) {
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
  const nlohmann::json& type = keys.Take("image_processor_type");
  if (type.is_string() && type.get<std::string>() == kPillowProcessorType) {
    p->resampler = Qwen2VlImageProcessor::Resampler::kPillow;
  }
  const nlohmann::json& resample = keys.Take("resample");
  if (!resample.is_null() && resample != kPilBicubic) {
    return keys.Error("resample",
                      resample.dump() + " is not supported by this engine (supported: 3, bicubic)");
  }
  ENGINE_RETURN_IF_ERROR(keys.RefuseUnread(
      kNeutralKeys, "is not supported by this engine's Qwen2-VL image processor"));
  if (p->patch_size > 1024 || p->temporal_patch_size > 64 || p->merge_size > 64 ||
      p->max_pixels > (int64_t{1} << 40)) {
    return InvalidArgumentError(where +
                                ": patch_size, temporal_patch_size, merge_size or "
                                "max_pixels above the largest this engine reads (1024, "
                                "64, 64, 2^40)");
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

}  // namespace

StatusOr<Qwen2VlImageProcessor> Qwen2VlImageProcessor::Read(const std::filesystem::path& path) {
  ENGINE_ASSIGN_OR_RETURN(std::string text, ReadUntrustedFile(path, FileKind::kConfig));
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return InvalidArgumentError("'" + path.string() + "' is not valid JSON");
  Qwen2VlImageProcessor processor;
  ENGINE_RETURN_IF_ERROR(ReadProcessorConfig(json, "'" + path.string() + "'", &processor));
  return processor;
}

StatusOr<std::pair<int64_t, int64_t>> Qwen2VlImageProcessor::ResizedSize(int64_t height,
                                                                         int64_t width) const {
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
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / factor)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / factor)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / factor)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / factor)) * factor;
  }
  if (h_bar <= 0 || w_bar <= 0 || h_bar * w_bar > max_pixels) {
    return InvalidArgumentError("an image of " + ImageSizeText(height, width) +
                                " pixels cannot be resized to multiples of " +
                                std::to_string(factor) + " within min_pixels " +
                                std::to_string(min_pixels) + " and max_pixels " +
                                std::to_string(max_pixels));
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
  const int64_t p = patch_size, m = merge_size, gh = height / p, gw = width / p;
  // The one frame repeated temporal_patch_size times, then grouped as (t, h/m, w/m, m, m) patches
  // of (C, T, p, p) values.
  at::Tensor frames = frame.unsqueeze(0).expand({temporal_patch_size, 3, height, width});
  return frames.reshape({1, temporal_patch_size, 3, gh / m, m, p, gw / m, m, p})
      .permute({0, 3, 6, 4, 7, 2, 1, 5, 8})
      .reshape({gh * gw, patch_values()})
      .contiguous();
}

}  // namespace engine
