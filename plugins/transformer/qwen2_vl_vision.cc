#include "qwen2_vl_vision.h"

#include <ATen/ATen.h>

#include <set>
#include <vector>

#include "engine/activation_checkpoint.h"
#include "engine/json_key_reader.h"
#include "llama_modules.h"
#include "qwen2_5_vl_vision.h"
#include "qwen3_vl_vision.h"

namespace engine::transformer {
namespace {

// config.json keys that do not change what the tower computes.
const std::set<std::string> kNeutralVisionKeys = {"torch_dtype", "dtype",
                                                  "_attn_implementation_autoset"};

}  // namespace

const char* VisionFamilyName(VisionFamily family) {
  switch (family) {
    case VisionFamily::kQwen25Vl:
      return "qwen2_5_vl";
    case VisionFamily::kQwen3Vl:
      return "qwen3_vl";
    case VisionFamily::kQwen2Vl:
      break;
  }
  return "qwen2_vl";
}

Status CheckGatedOrWideVisionSizes(const Qwen2VlVisionConfig& c) {
  for (int64_t v : {c.depth, c.embed_dim, c.hidden_size, c.intermediate_size, c.num_heads,
                    c.in_channels, c.patch_size, c.spatial_merge_size, c.temporal_patch_size}) {
    if (v <= 0) return InvalidArgumentError("vision sizes must all be positive");
  }
  if (c.embed_dim > (1 << 16) || c.hidden_size > (1 << 17) || c.intermediate_size > (1 << 18) ||
      c.depth > 1024 || c.num_heads > 1024 || c.patch_size > 1024 || c.temporal_patch_size > 64 ||
      c.spatial_merge_size > 64) {
    return InvalidArgumentError(
        "vision sizes above the largest this loader builds (hidden_size 65536, out_hidden_size "
        "131072, intermediate_size 262144, depth 1024, num_heads 1024, patch_size 1024, "
        "temporal_patch_size 64, spatial_merge_size 64)");
  }
  if (c.embed_dim % c.num_heads != 0 || c.head_dim() % 4 != 0) {
    return InvalidArgumentError("vision hidden_size " + std::to_string(c.embed_dim) +
                                " must be num_heads (" + std::to_string(c.num_heads) +
                                ") heads of a multiple of 4 (2-D rotary)");
  }
  return Status::Ok();
}

torch::nn::LayerNorm VisionLayerNorm(int64_t size) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({size}).eps(1e-6));
}

// In f32 for another dtype: autocast's policy for layer_norm, which LibTorch's CPU autocast leaves
// to the kernel, and that kernel refuses bf16 input with f32 weights.
at::Tensor ApplyVisionNorm(torch::nn::LayerNorm& norm, const at::Tensor& x) {
  if (x.scalar_type() == norm->weight.scalar_type()) return norm->forward(x);
  return at::layer_norm(x.to(at::kFloat), norm->options.normalized_shape(),
                        norm->weight.to(at::kFloat), norm->bias.to(at::kFloat),
                        norm->options.eps());
}

Status Qwen2VlVisionConfig::Check() const {
  if (family == VisionFamily::kQwen25Vl) return CheckQwen25VlVision(*this);
  if (family == VisionFamily::kQwen3Vl) return CheckQwen3VlVision(*this);
  for (int64_t v : {depth, embed_dim, hidden_size, num_heads, mlp_ratio, in_channels, patch_size,
                    spatial_merge_size, temporal_patch_size}) {
    if (v <= 0) return InvalidArgumentError("vision sizes must all be positive");
  }
  if (embed_dim > (1 << 16) || hidden_size > (1 << 17) || depth > 1024 || num_heads > 1024 ||
      mlp_ratio > 64 || patch_size > 1024 || temporal_patch_size > 64 || spatial_merge_size > 64) {
    return InvalidArgumentError("vision sizes above the largest this loader builds");
  }
  if (embed_dim % num_heads != 0 || head_dim() % 4 != 0) {
    return InvalidArgumentError("vision embed_dim " + std::to_string(embed_dim) +
                                " must be num_heads (" + std::to_string(num_heads) +
                                ") heads of a multiple of 4 (2-D rotary)");
  }
  return Status::Ok();
}

nlohmann::json Qwen2VlVisionConfig::ToJson() const {
  if (family == VisionFamily::kQwen25Vl) return Qwen25VlVisionJson(*this);
  if (family == VisionFamily::kQwen3Vl) return Qwen3VlVisionJson(*this);
  nlohmann::json json = {{"model_type", "qwen2_vl"},
                         {"depth", depth},
                         {"embed_dim", embed_dim},
                         {"hidden_size", hidden_size},
                         {"hidden_act", ActivationName(hidden_act)},
                         {"mlp_ratio", mlp_ratio},
                         {"num_heads", num_heads},
                         {"in_channels", in_channels},
                         {"patch_size", patch_size},
                         {"spatial_merge_size", spatial_merge_size},
                         {"temporal_patch_size", temporal_patch_size}};
  // Only another base needs saying: transformers 4 has no key for it and uses 10000, as 5 does.
  if (rope_theta != 10000.0) {
    json["rope_parameters"] = {{"rope_type", "axial"}, {"rope_theta", rope_theta}};
  }
  return json;
}

StatusOr<Qwen2VlVisionConfig> Qwen2VlVisionConfigFromJson(const nlohmann::json& json,
                                                          const std::string& where) {
  if (!json.is_object()) return InvalidArgumentError(where + " is not an object");
  Qwen2VlVisionConfig c;
  JsonKeyReader keys(json, where);
  for (auto [key, value] : {std::pair<const char*, int64_t*>{"depth", &c.depth},
                            {"embed_dim", &c.embed_dim},
                            {"hidden_size", &c.hidden_size},
                            {"num_heads", &c.num_heads},
                            {"mlp_ratio", &c.mlp_ratio},
                            {"in_channels", &c.in_channels},
                            {"patch_size", &c.patch_size},
                            {"spatial_merge_size", &c.spatial_merge_size},
                            {"temporal_patch_size", &c.temporal_patch_size}}) {
    ENGINE_RETURN_IF_ERROR(keys.PositiveInt(key, value));
  }
  return FinishVisionConfig(keys, where, c);
}

StatusOr<Qwen2VlVisionConfig> FinishVisionConfig(JsonKeyReader& keys, const std::string& where,
                                                 Qwen2VlVisionConfig c) {
  ENGINE_RETURN_IF_ERROR(CheckUnreadVisionCopies(keys, c.in_channels, c.patch_size));
  ENGINE_RETURN_IF_ERROR(ReadVisionActivation(keys, &c.hidden_act));
  if (const nlohmann::json& range = keys.Take("initializer_range"); range.is_number()) {
    c.initializer_range = range.get<double>();
  }
  ENGINE_RETURN_IF_ERROR(ReadVisionRope(keys, &c.rope_theta));
  // A vision config of another family (Qwen3-VL's beside a Qwen2.5-VL decoder) computes otherwise.
  const std::string family = VisionFamilyName(c.family);
  if (const nlohmann::json& type = keys.Take("model_type");
      !type.is_null() && type != family && type != family + "_vision") {
    return keys.Error("model_type", "is " + type.dump() + ", not the vision config of " + family +
                                        " (" + family + "_vision)");
  }
  const std::string tower = c.family == VisionFamily::kQwen25Vl  ? "Qwen2.5-VL vision tower"
                            : c.family == VisionFamily::kQwen3Vl ? "Qwen3-VL vision tower"
                                                                 : "Qwen2-VL vision tower";
  ENGINE_RETURN_IF_ERROR(
      keys.RefuseUnread(kNeutralVisionKeys, "is not supported by this engine's " + tower));
  Status checked = c.Check();
  if (!checked.ok()) return InvalidArgumentError(where + ": " + checked.message());
  return c;
}

Qwen2VlVisionBlockImpl::Qwen2VlVisionBlockImpl(const Qwen2VlVisionConfig& config)
    : config_(config) {
  const int64_t d = config.embed_dim;
  norm1 = register_module("norm1", VisionLayerNorm(d));
  norm2 = register_module("norm2", VisionLayerNorm(d));
  auto attn = register_module("attn", std::make_shared<torch::nn::Module>());
  qkv = attn->register_module("qkv", engine::Linear(d, 3 * d, /*bias=*/true));
  proj = attn->register_module("proj", engine::Linear(d, d, /*bias=*/true));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  const bool v3 = config.family == VisionFamily::kQwen3Vl;
  const int64_t width = v3 ? config.intermediate_size : d * config.mlp_ratio;
  fc1 = mlp->register_module(v3 ? "linear_fc1" : "fc1", engine::Linear(d, width, /*bias=*/true));
  fc2 = mlp->register_module(v3 ? "linear_fc2" : "fc2", engine::Linear(width, d, /*bias=*/true));
}

at::Tensor Qwen2VlVisionBlockImpl::forward(const at::Tensor& x, const VisionRotary& rotary,
                                           const std::vector<int64_t>& frame_lengths) {
  const at::Tensor attended = SegmentedVisionAttention(qkv->forward(ApplyVisionNorm(norm1, x)),
                                                       config_.num_heads, rotary, frame_lengths);
  const at::Tensor h = x + proj->forward(attended);
  return h + fc2->forward(Activate(fc1->forward(ApplyVisionNorm(norm2, h)), config_.hidden_act));
}

Qwen2VlVisionTowerImpl::Qwen2VlVisionTowerImpl(const Qwen2VlVisionConfig& config)
    : config_(config) {
  const int64_t d = config.embed_dim, m = config.spatial_merge_size;
  patch_weight = RegisterPatchEmbedding(*this, d, config.in_channels, config.temporal_patch_size,
                                        config.patch_size);
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.depth; ++i) blocks->push_back(Qwen2VlVisionBlock(config));
  auto merger = register_module("merger", std::make_shared<torch::nn::Module>());
  ln_q = merger->register_module("ln_q", VisionLayerNorm(d));
  auto mlp = merger->register_module("mlp", std::make_shared<torch::nn::Module>());
  merger_fc1 = mlp->register_module("0", engine::Linear(d * m * m, d * m * m, /*bias=*/true));
  merger_fc2 =
      mlp->register_module("2", engine::Linear(d * m * m, config.hidden_size, /*bias=*/true));
}

void Qwen2VlVisionTowerImpl::Initialize() {
  InitializeQwenVision(*this, config_.initializer_range);
}

VisionTokens Qwen2VlVisionTowerImpl::Encode(const at::Tensor& pixel_values,
                                            const std::vector<ImageGrid>& grids,
                                            bool checkpointing) {
  at::Tensor x = EmbedPatches(patch_weight, pixel_values);
  const VisionRotary rotary = QwenVisionRotary(grids, config_.spatial_merge_size,
                                               config_.head_dim(), config_.rope_theta, x.device());
  const std::vector<int64_t> frame_lengths = FrameLengths(grids);
  for (const auto& module : *blocks) {
    auto block = std::dynamic_pointer_cast<Qwen2VlVisionBlockImpl>(module);
    // By value: the recomputation in backward outlives this frame.
    auto run = [block, rotary, frame_lengths](const at::Tensor& h) {
      return block->forward(h, rotary, frame_lengths);
    };
    x = checkpointing ? engine::CheckpointedForward(run, x) : run(x);
  }
  const int64_t merged =
      config_.embed_dim * config_.spatial_merge_size * config_.spatial_merge_size;
  const at::Tensor groups = ApplyVisionNorm(ln_q, x).reshape({-1, merged});
  return {merger_fc2->forward(at::gelu(merger_fc1->forward(groups))), {}};
}

}  // namespace engine::transformer
