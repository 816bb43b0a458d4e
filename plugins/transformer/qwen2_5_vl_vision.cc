#include "qwen2_5_vl_vision.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>

#include "engine/activation_checkpoint.h"
#include "engine/json_key_reader.h"

namespace engine::transformer {
namespace {

constexpr double kNormEps = 1e-6;

// transformers' Qwen2_5_VLVisionConfig defaults: Qwen2.5-VL-7B's tower.
Qwen2VlVisionConfig Qwen25VlDefaultConfig() {
  Qwen2VlVisionConfig c;
  c.family = VisionFamily::kQwen25Vl;
  c.depth = 32;
  c.embed_dim = 3584;
  c.hidden_size = 3584;
  c.intermediate_size = 3420;
  c.num_heads = 16;
  c.hidden_act = Activation::kSilu;
  c.window_size = 112;
  c.fullatt_block_indexes = {7, 15, 23, 31};
  c.tokens_per_second = 4;
  return c;
}

}  // namespace

StatusOr<Qwen2VlVisionConfig> Qwen25VlVisionConfigFromJson(const nlohmann::json& json,
                                                           const std::string& where) {
  if (!json.is_object()) return InvalidArgumentError(where + " is not an object");
  Qwen2VlVisionConfig c = Qwen25VlDefaultConfig();
  JsonKeyReader keys(json, where);
  for (auto [key, value] : {std::pair<const char*, int64_t*>{"depth", &c.depth},
                            {"hidden_size", &c.embed_dim},
                            {"intermediate_size", &c.intermediate_size},
                            {"out_hidden_size", &c.hidden_size},
                            {"num_heads", &c.num_heads},
                            {"in_channels", &c.in_channels},
                            {"patch_size", &c.patch_size},
                            {"spatial_merge_size", &c.spatial_merge_size},
                            {"temporal_patch_size", &c.temporal_patch_size},
                            {"window_size", &c.window_size},
                            {"tokens_per_second", &c.tokens_per_second}}) {
    ENGINE_RETURN_IF_ERROR(keys.PositiveInt(key, value));
  }
  ENGINE_RETURN_IF_ERROR(
      ReadVisionBlockList(keys, "fullatt_block_indexes", c.depth, &c.fullatt_block_indexes));
  return FinishVisionConfig(keys, where, c);
}

Status CheckQwen25VlVision(const Qwen2VlVisionConfig& c) {
  ENGINE_RETURN_IF_ERROR(CheckGatedOrWideVisionSizes(c));
  if (c.window_size <= 0 || c.tokens_per_second <= 0 || c.window_size > (1 << 16)) {
    return InvalidArgumentError(
        "vision window_size (1 to 65536) and tokens_per_second must be "
        "positive, not " +
        std::to_string(c.window_size) + " and " + std::to_string(c.tokens_per_second));
  }
  const int64_t merged_patch = c.patch_size * c.spatial_merge_size;
  if (c.window_size % merged_patch != 0) {
    return InvalidArgumentError(
        "vision window_size " + std::to_string(c.window_size) +
        " is not a multiple of the merged patch (patch_size x spatial_merge_size = " +
        std::to_string(merged_patch) + " pixels): windows must hold whole merged patches");
  }
  for (int64_t index : c.fullatt_block_indexes) {
    if (index < 0 || index >= c.depth) {
      return InvalidArgumentError("vision fullatt_block_indexes holds " + std::to_string(index) +
                                  ", beyond the depth " + std::to_string(c.depth));
    }
  }
  return Status::Ok();
}

nlohmann::json Qwen25VlVisionJson(const Qwen2VlVisionConfig& c) {
  nlohmann::json json = {{"model_type", "qwen2_5_vl"},
                         {"depth", c.depth},
                         {"hidden_size", c.embed_dim},
                         {"intermediate_size", c.intermediate_size},
                         {"out_hidden_size", c.hidden_size},
                         {"hidden_act", ActivationName(c.hidden_act)},
                         {"num_heads", c.num_heads},
                         {"in_channels", c.in_channels},
                         {"patch_size", c.patch_size},
                         {"spatial_merge_size", c.spatial_merge_size},
                         {"temporal_patch_size", c.temporal_patch_size},
                         {"window_size", c.window_size},
                         {"fullatt_block_indexes", c.fullatt_block_indexes},
                         {"tokens_per_second", c.tokens_per_second}};
  if (c.rope_theta != 10000.0) {
    json["rope_parameters"] = {{"rope_type", "axial"}, {"rope_theta", c.rope_theta}};
  }
  return json;
}

VisionWindows QwenVisionWindows(const std::vector<ImageGrid>& grids, int64_t spatial_merge_size,
                                int64_t merged_patches_per_window_side) {
  const int64_t side = merged_patches_per_window_side;
  const int64_t unit = spatial_merge_size * spatial_merge_size;
  std::vector<int64_t> order;
  VisionWindows windows;
  int64_t first = 0;  // the first merged patch of the image
  for (const ImageGrid& g : grids) {
    const int64_t rows = g.h / spatial_merge_size, cols = g.w / spatial_merge_size;
    for (int64_t t = 0; t < g.t; ++t) {
      const int64_t frame = first + t * rows * cols;
      for (int64_t top = 0; top < rows; top += side) {
        for (int64_t left = 0; left < cols; left += side) {
          const int64_t bottom = std::min(top + side, rows), right = std::min(left + side, cols);
          for (int64_t y = top; y < bottom; ++y) {
            for (int64_t x = left; x < right; ++x) order.push_back(frame + y * cols + x);
          }
          windows.lengths.push_back((bottom - top) * (right - left) * unit);
        }
      }
    }
    first += g.t * rows * cols;
  }
  windows.order = at::tensor(order, at::kLong);
  return windows;
}

Qwen25VlVisionBlockImpl::Qwen25VlVisionBlockImpl(const Qwen2VlVisionConfig& config)
    : num_heads_(config.num_heads) {
  const int64_t d = config.embed_dim;
  norm1 = register_module("norm1", RmsNorm(d, kNormEps));
  norm2 = register_module("norm2", RmsNorm(d, kNormEps));
  auto attn = register_module("attn", std::make_shared<torch::nn::Module>());
  qkv = attn->register_module("qkv", engine::Linear(d, 3 * d, /*bias=*/true));
  proj = attn->register_module("proj", engine::Linear(d, d, /*bias=*/true));
  mlp = register_module("mlp",
                        LlamaMlp(d, config.intermediate_size, /*bias=*/true, config.hidden_act));
}

at::Tensor Qwen25VlVisionBlockImpl::forward(const at::Tensor& x, const VisionRotary& rotary,
                                            const std::vector<int64_t>& segment_lengths) {
  const at::Tensor attended = SegmentedVisionAttention(qkv->forward(norm1->forward(x)), num_heads_,
                                                       rotary, segment_lengths);
  const at::Tensor h = x + proj->forward(attended);
  return h + mlp->forward(norm2->forward(h));
}

Qwen25VlVisionTowerImpl::Qwen25VlVisionTowerImpl(const Qwen2VlVisionConfig& config)
    : config_(config) {
  const int64_t d = config.embed_dim, m = config.spatial_merge_size;
  patch_weight = RegisterPatchEmbedding(*this, d, config.in_channels, config.temporal_patch_size,
                                        config.patch_size);
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.depth; ++i) blocks->push_back(Qwen25VlVisionBlock(config));
  auto merger = register_module("merger", std::make_shared<torch::nn::Module>());
  ln_q = merger->register_module("ln_q", RmsNorm(d, kNormEps));
  auto mlp = merger->register_module("mlp", std::make_shared<torch::nn::Module>());
  merger_fc1 = mlp->register_module("0", engine::Linear(d * m * m, d * m * m, /*bias=*/true));
  merger_fc2 =
      mlp->register_module("2", engine::Linear(d * m * m, config.hidden_size, /*bias=*/true));
}

void Qwen25VlVisionTowerImpl::Initialize() {
  InitializeQwenVision(*this, config_.initializer_range);
}

VisionTokens Qwen25VlVisionTowerImpl::Encode(const at::Tensor& pixel_values,
                                             const std::vector<ImageGrid>& grids,
                                             bool checkpointing) {
  const int64_t merge = config_.spatial_merge_size, unit = merge * merge;
  at::Tensor x = EmbedPatches(patch_weight, pixel_values);
  VisionRotary rotary =
      QwenVisionRotary(grids, merge, config_.head_dim(), config_.rope_theta, x.device());
  // The blocks see the patches window by window; frames stay whole and in order, so the frame
  // lengths still cut the full-attention blocks' runs.
  const VisionWindows windows =
      QwenVisionWindows(grids, merge, config_.window_size / (config_.patch_size * merge));
  x = PermuteMergedGroups(x, windows.order, unit);
  rotary.cos = PermuteMergedGroups(rotary.cos, windows.order, unit);
  rotary.sin = PermuteMergedGroups(rotary.sin, windows.order, unit);
  const std::vector<int64_t> frame_lengths = FrameLengths(grids);
  const std::set<int64_t> full(config_.fullatt_block_indexes.begin(),
                               config_.fullatt_block_indexes.end());
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto block = std::dynamic_pointer_cast<Qwen25VlVisionBlockImpl>(blocks->ptr(i));
    const std::vector<int64_t>& segments =
        full.count(static_cast<int64_t>(i)) != 0 ? frame_lengths : windows.lengths;
    // By value: the recomputation in backward outlives this frame.
    auto run = [block, rotary, segments](const at::Tensor& h) {
      return block->forward(h, rotary, segments);
    };
    x = checkpointing ? engine::CheckpointedForward(run, x) : run(x);
  }
  const at::Tensor merged = merger_fc2->forward(
      at::gelu(merger_fc1->forward(ln_q->forward(x).reshape({-1, config_.embed_dim * unit}))));
  return {merged.index_select(0, at::argsort(windows.order).to(merged.device())), {}};
}

}  // namespace engine::transformer
