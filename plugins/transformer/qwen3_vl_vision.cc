#include "qwen3_vl_vision.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "engine/activation_checkpoint.h"
#include "engine/json_key_reader.h"

namespace engine::transformer {
namespace {

// transformers' Qwen3VLVisionConfig defaults.
Qwen2VlVisionConfig Qwen3VlDefaultConfig() {
  Qwen2VlVisionConfig c;
  c.family = VisionFamily::kQwen3Vl;
  c.depth = 27;
  c.embed_dim = 1152;
  c.hidden_size = 3584;
  c.intermediate_size = 4304;
  c.num_heads = 16;
  c.patch_size = 16;
  c.hidden_act = Activation::kGeluTanh;
  c.num_position_embeddings = 2304;
  c.deepstack_visual_indexes = {8, 16, 24};
  return c;
}

Status ReadDeepstackIndexes(JsonKeyReader& keys, Qwen2VlVisionConfig* c) {
  std::vector<int64_t>& blocks = c->deepstack_visual_indexes;
  ENGINE_RETURN_IF_ERROR(ReadVisionBlockList(keys, "deepstack_visual_indexes", c->depth, &blocks));
  for (auto it = blocks.begin(); it != blocks.end(); ++it) {
    if (std::find(blocks.begin(), it, *it) != it) {
      // transformers would feed one block's features to two decoder layers through one merger
      // and leave the other merger unused.
      return keys.Error("deepstack_visual_indexes",
                        "holds block " + std::to_string(*it) + " twice");
    }
  }
  return Status::Ok();
}

// The side of the square grid of learned positions.
int64_t GridSide(int64_t num_position_embeddings) {
  auto side = static_cast<int64_t>(std::sqrt(static_cast<double>(num_position_embeddings)));
  while (side * side > num_position_embeddings) --side;
  while ((side + 1) * (side + 1) <= num_position_embeddings) ++side;
  return side;
}

}  // namespace

StatusOr<Qwen2VlVisionConfig> Qwen3VlVisionConfigFromJson(const nlohmann::json& json,
                                                          const std::string& where) {
  if (!json.is_object()) return InvalidArgumentError(where + " is not an object");
  Qwen2VlVisionConfig c = Qwen3VlDefaultConfig();
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
                            {"num_position_embeddings", &c.num_position_embeddings}}) {
    ENGINE_RETURN_IF_ERROR(keys.PositiveInt(key, value));
  }
  ENGINE_RETURN_IF_ERROR(ReadDeepstackIndexes(keys, &c));
  return FinishVisionConfig(keys, where, c);
}

Status CheckQwen3VlVision(const Qwen2VlVisionConfig& c) {
  ENGINE_RETURN_IF_ERROR(CheckGatedOrWideVisionSizes(c));
  if (c.num_position_embeddings <= 0 || c.num_position_embeddings > (1 << 20)) {
    return InvalidArgumentError("vision num_position_embeddings must be 1 to 1,048,576, not " +
                                std::to_string(c.num_position_embeddings));
  }
  const int64_t side = GridSide(c.num_position_embeddings);
  if (side * side != c.num_position_embeddings) {
    // transformers would use only the first side^2 rows of the table.
    return InvalidArgumentError("vision num_position_embeddings " +
                                std::to_string(c.num_position_embeddings) +
                                " is not a square grid of positions");
  }
  for (int64_t index : c.deepstack_visual_indexes) {
    if (index < 0 || index >= c.depth) {
      return InvalidArgumentError("vision deepstack_visual_indexes holds " + std::to_string(index) +
                                  ", beyond the depth " + std::to_string(c.depth));
    }
  }
  return Status::Ok();
}

nlohmann::json Qwen3VlVisionJson(const Qwen2VlVisionConfig& c) {
  return {{"model_type", "qwen3_vl_vision"},
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
          {"num_position_embeddings", c.num_position_embeddings},
          {"deepstack_visual_indexes", c.deepstack_visual_indexes},
          {"initializer_range", c.initializer_range},
          {"rope_parameters", {{"rope_type", "axial"}, {"rope_theta", c.rope_theta}}}};
}

at::Tensor InterpolatedPositions(const at::Tensor& table, const std::vector<ImageGrid>& grids,
                                 int64_t merge) {
  const int64_t width = table.size(1), side = GridSide(table.size(0));
  // [1, width, side, side]: the table as an image with one channel per feature.
  const at::Tensor image =
      table.to(at::kFloat).reshape({side, side, width}).permute({2, 0, 1}).unsqueeze(0);
  std::vector<at::Tensor> parts;
  for (const ImageGrid& g : grids) {
    const at::Tensor resampled =
        at::upsample_bilinear2d(image, {g.h, g.w}, /*align_corners=*/true);  // [1, width, h, w]
    // The patches in merged order: each merge x merge group together.
    const at::Tensor merged = resampled.squeeze(0)
                                  .permute({1, 2, 0})
                                  .reshape({g.h / merge, merge, g.w / merge, merge, width})
                                  .permute({0, 2, 1, 3, 4})
                                  .reshape({g.h * g.w, width});
    parts.push_back(g.t == 1 ? merged : merged.repeat({g.t, 1}));
  }
  return at::cat(parts);
}

Qwen3VlPatchMergerImpl::Qwen3VlPatchMergerImpl(const Qwen2VlVisionConfig& config, bool after_merge)
    : merged_width_(config.embed_dim * config.spatial_merge_size * config.spatial_merge_size),
      after_merge_(after_merge) {
  norm = register_module("norm", VisionLayerNorm(after_merge ? merged_width_ : config.embed_dim));
  linear_fc1 =
      register_module("linear_fc1", engine::Linear(merged_width_, merged_width_, /*bias=*/true));
  linear_fc2 = register_module("linear_fc2",
                               engine::Linear(merged_width_, config.hidden_size, /*bias=*/true));
}

at::Tensor Qwen3VlPatchMergerImpl::forward(const at::Tensor& x) {
  const at::Tensor groups = after_merge_ ? ApplyVisionNorm(norm, x.reshape({-1, merged_width_}))
                                         : ApplyVisionNorm(norm, x).reshape({-1, merged_width_});
  return linear_fc2->forward(at::gelu(linear_fc1->forward(groups)));
}

Qwen3VlVisionTowerImpl::Qwen3VlVisionTowerImpl(const Qwen2VlVisionConfig& config)
    : config_(config) {
  const int64_t d = config.embed_dim;
  patch_weight = RegisterPatchEmbedding(*this, d, config.in_channels, config.temporal_patch_size,
                                        config.patch_size, &patch_bias);
  auto positions = register_module("pos_embed", std::make_shared<torch::nn::Module>());
  pos_embed =
      positions->register_parameter("weight", at::empty({config.num_position_embeddings, d}));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.depth; ++i) blocks->push_back(Qwen2VlVisionBlock(config));
  merger = register_module("merger", Qwen3VlPatchMerger(config, /*after_merge=*/false));
  deepstack_mergers = register_module("deepstack_merger_list", torch::nn::ModuleList());
  for (size_t i = 0; i < config.deepstack_visual_indexes.size(); ++i) {
    deepstack_mergers->push_back(Qwen3VlPatchMerger(config, /*after_merge=*/true));
  }
}

void Qwen3VlVisionTowerImpl::Initialize() {
  InitializeQwenVision(*this, config_.initializer_range);
}

VisionTokens Qwen3VlVisionTowerImpl::Encode(const at::Tensor& pixel_values,
                                            const std::vector<ImageGrid>& grids,
                                            bool checkpointing) {
  at::Tensor x = EmbedPatches(patch_weight, pixel_values, patch_bias);
  x = x + InterpolatedPositions(pos_embed, grids, config_.spatial_merge_size).to(x.scalar_type());
  const VisionRotary rotary = QwenVisionRotary(grids, config_.spatial_merge_size,
                                               config_.head_dim(), config_.rope_theta, x.device());
  const std::vector<int64_t> frame_lengths = FrameLengths(grids);
  const std::vector<int64_t>& deepstack_blocks = config_.deepstack_visual_indexes;
  VisionTokens tokens;
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto typed = std::dynamic_pointer_cast<Qwen2VlVisionBlockImpl>(blocks->ptr(i));
    // By value: the recomputation in backward outlives this frame.
    auto run = [typed, rotary, frame_lengths](const at::Tensor& h) {
      return typed->forward(h, rotary, frame_lengths);
    };
    x = checkpointing ? engine::CheckpointedForward(run, x) : run(x);
    const auto at =
        std::find(deepstack_blocks.begin(), deepstack_blocks.end(), static_cast<int64_t>(i));
    if (at != deepstack_blocks.end()) {
      tokens.deepstack.push_back(
          deepstack_mergers[static_cast<size_t>(at - deepstack_blocks.begin())]
              ->as<Qwen3VlPatchMergerImpl>()
              ->forward(x));
    }
  }
  tokens.merged = merger->forward(x);
  return tokens;
}

}  // namespace engine::transformer
