#include "vision_modules.h"

#include <ATen/ATen.h>

#include <cmath>

#include "engine/activation_checkpoint.h"

namespace engine::transformer {
namespace {

torch::nn::LayerNorm Norm(const VisionConfig& c) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps));
}

StatusOr<int64_t> PositiveInt(const nlohmann::json& json, const std::string& key,
                              const std::string& where) {
  auto it = json.find(key);
  if (it == json.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) {
    return InvalidArgumentError(where + ": '" + key + "' must be a positive integer" +
                                (it == json.end() ? " (it is missing)" : ", not " + it->dump()));
  }
  return it->get<int64_t>();
}

}  // namespace

Status VisionConfig::Check() const {
  if (channels <= 0 || image_size <= 0 || patch_size <= 0 || hidden_size <= 0 || num_layers <= 0 ||
      num_heads <= 0 || mlp_ratio <= 0) {
    return InvalidArgumentError("vision sizes must all be positive");
  }
  if (hidden_size > (1 << 16) || num_layers > 1024 || num_heads > 1024 || mlp_ratio > 64 ||
      image_size > (1 << 14)) {
    return InvalidArgumentError(
        "vision sizes above the largest this loader builds (hidden_size 65536, num_layers 1024, "
        "num_heads 1024, mlp_ratio 64, image size 16384)");
  }
  if (image_size % patch_size != 0) {
    return InvalidArgumentError("the image size " + std::to_string(image_size) +
                                " is not a multiple of patch_size " + std::to_string(patch_size));
  }
  if (hidden_size % num_heads != 0) {
    return InvalidArgumentError("vision hidden_size " + std::to_string(hidden_size) +
                                " is not a multiple of num_heads " + std::to_string(num_heads));
  }
  return Status::Ok();
}

nlohmann::json VisionConfig::ToJson() const {
  return {{"num_channels", channels},        {"image_size", image_size},
          {"patch_size", patch_size},        {"hidden_size", hidden_size},
          {"num_hidden_layers", num_layers}, {"num_attention_heads", num_heads},
          {"mlp_ratio", mlp_ratio},          {"layer_norm_eps", layer_norm_eps}};
}

StatusOr<VisionConfig> VisionConfigFromOptions(const VisionOptions& o, int64_t channels,
                                               int64_t image_size) {
  VisionConfig c;
  c.channels = channels;
  c.image_size = image_size;
  c.patch_size = o.patch_size();
  c.hidden_size = o.hidden_size();
  c.num_layers = o.num_layers();
  c.num_heads = o.num_heads();
  c.mlp_ratio = o.mlp_ratio();
  c.layer_norm_eps = o.layer_norm_eps();
  ENGINE_RETURN_IF_ERROR(c.Check());
  return c;
}

StatusOr<VisionConfig> VisionConfigFromJson(const nlohmann::json& json, const std::string& where) {
  if (!json.is_object()) return InvalidArgumentError(where + " is not a JSON object");
  VisionConfig c;
  ENGINE_ASSIGN_OR_RETURN(c.channels, PositiveInt(json, "num_channels", where));
  ENGINE_ASSIGN_OR_RETURN(c.image_size, PositiveInt(json, "image_size", where));
  ENGINE_ASSIGN_OR_RETURN(c.patch_size, PositiveInt(json, "patch_size", where));
  ENGINE_ASSIGN_OR_RETURN(c.hidden_size, PositiveInt(json, "hidden_size", where));
  ENGINE_ASSIGN_OR_RETURN(c.num_layers, PositiveInt(json, "num_hidden_layers", where));
  ENGINE_ASSIGN_OR_RETURN(c.num_heads, PositiveInt(json, "num_attention_heads", where));
  ENGINE_ASSIGN_OR_RETURN(c.mlp_ratio, PositiveInt(json, "mlp_ratio", where));
  auto eps = json.find("layer_norm_eps");
  if (eps != json.end()) {
    if (!eps->is_number() || !(eps->get<double>() > 0)) {
      return InvalidArgumentError(where + ": 'layer_norm_eps' must be a positive number");
    }
    c.layer_norm_eps = eps->get<double>();
  }
  Status checked = c.Check();
  if (!checked.ok()) return InvalidArgumentError(where + ": " + checked.message());
  return c;
}

VisionBlockImpl::VisionBlockImpl(const VisionConfig& config) : config_(config) {
  const int64_t h = config.hidden_size;
  norm1 = register_module("norm1", Norm(config));
  auto attn = register_module("attn", std::make_shared<torch::nn::Module>());
  qkv = attn->register_module("qkv", engine::Linear(h, 3 * h, /*bias=*/true));
  proj = attn->register_module("proj", engine::Linear(h, h, /*bias=*/true));
  norm2 = register_module("norm2", Norm(config));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", engine::Linear(h, config.mlp_ratio * h, /*bias=*/true));
  fc2 = mlp->register_module("fc2", engine::Linear(config.mlp_ratio * h, h, /*bias=*/true));
}

at::Tensor VisionBlockImpl::forward(const at::Tensor& x) {
  const int64_t batch = x.size(0), tokens = x.size(1), heads = config_.num_heads;
  const int64_t d = config_.hidden_size / heads;
  const at::Tensor parts =
      qkv->forward(norm1->forward(x)).view({batch, tokens, 3, heads, d}).permute({2, 0, 3, 1, 4});
  const at::Tensor q = parts[0], k = parts[1], v = parts[2];
  const at::Tensor scores = at::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(d));
  const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(v.scalar_type());
  const at::Tensor attended =
      at::matmul(probs, v).transpose(1, 2).reshape({batch, tokens, config_.hidden_size});
  const at::Tensor h = x + proj->forward(attended);
  return h + fc2->forward(at::gelu(fc1->forward(norm2->forward(h))));
}

VisionTowerImpl::VisionTowerImpl(const VisionConfig& config) : config_(config) {
  const int64_t patch_dim = config.channels * config.patch_size * config.patch_size;
  patch_embed =
      register_module("patch_embed", engine::Linear(patch_dim, config.hidden_size, /*bias=*/true));
  pos_embed =
      register_parameter("pos_embed", at::zeros({config.num_patches(), config.hidden_size}));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_layers; ++i) blocks->push_back(VisionBlock(config));
  norm = register_module("norm", Norm(config));
}

at::Tensor VisionTowerImpl::forward(const at::Tensor& pixels, bool checkpointing) {
  const int64_t batch = pixels.size(0), c = config_.channels, p = config_.patch_size;
  const int64_t grid = config_.image_size / p;
  // [B, C, G, p, G, p] -> [B, G, G, C, p, p] -> [B, G*G, C*p*p]
  const at::Tensor patches = pixels.reshape({batch, c, grid, p, grid, p})
                                 .permute({0, 2, 4, 1, 3, 5})
                                 .reshape({batch, grid * grid, c * p * p});
  at::Tensor h = patch_embed->forward(patches.to(patch_embed->weight.scalar_type())) + pos_embed;
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto block = blocks[i]->as<VisionBlockImpl>();
    h = checkpointing
            ? CheckpointedForward([block](const at::Tensor& x) { return block->forward(x); }, h)
            : block->forward(h);
  }
  return norm->forward(h);
}

}  // namespace engine::transformer
