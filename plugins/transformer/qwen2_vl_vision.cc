#include "qwen2_vl_vision.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>
#include <vector>

#include "engine/activation_checkpoint.h"
#include "engine/json_key_reader.h"
#include "kernel_ops.h"
#include "llama_modules.h"

namespace engine::transformer {
namespace {

// Every patch's keys: its frame's patches, as int32 [1, patches, 2] (first, end) for the
// attention kernel.
at::Tensor FrameKeyRanges(const std::vector<int64_t>& frame_lengths) {
  std::vector<int32_t> ranges;
  int64_t start = 0;
  for (int64_t length : frame_lengths) {
    for (int64_t i = 0; i < length; ++i) {
      ranges.push_back(static_cast<int32_t>(start));
      ranges.push_back(static_cast<int32_t>(start + length));
    }
    start += length;
  }
  return at::tensor(ranges, at::kInt).view({1, start, 2});
}

constexpr double kNormEps = 1e-6;

torch::nn::LayerNorm Norm(int64_t size) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({size}).eps(kNormEps));
}

// LayerNorm of `x` whatever its dtype: in the weights' dtype when `x` has it, otherwise in f32
// (autocast's policy for layer_norm, which LibTorch 1.13's CPU autocast leaves to the kernel, and
// that kernel refuses bf16 input with f32 weights).
at::Tensor ApplyNorm(torch::nn::LayerNorm& norm, const at::Tensor& x) {
  if (x.scalar_type() == norm->weight.scalar_type()) return norm->forward(x);
  return at::layer_norm(x.to(at::kFloat), norm->options.normalized_shape(),
                        norm->weight.to(at::kFloat), norm->bias.to(at::kFloat),
                        norm->options.eps());
}

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// Each patch's (row, column) in its image, in the merged order the image processor wrote them.
at::Tensor PatchRowsAndColumns(const std::vector<ImageGrid>& grids, int64_t merge) {
  std::vector<at::Tensor> parts;
  for (const ImageGrid& g : grids) {
    const at::Tensor rows = at::arange(g.h, at::kLong).unsqueeze(1).expand({g.h, g.w});
    const at::Tensor cols = at::arange(g.w, at::kLong).unsqueeze(0).expand({g.h, g.w});
    auto merged = [&](const at::Tensor& t) {
      return t.reshape({g.h / merge, merge, g.w / merge, merge}).permute({0, 2, 1, 3}).flatten();
    };
    parts.push_back(at::stack({merged(rows), merged(cols)}, -1).repeat({g.t, 1}));
  }
  return at::cat(parts);
}

// config.json keys that do not change what the tower computes.
const std::set<std::string> kNeutralVisionKeys = {
    "model_type", "torch_dtype", "dtype", "_attn_implementation_autoset", "initializer_range"};

}  // namespace

Status Qwen2VlVisionConfig::Check() const {
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

namespace {

// transformers 5 writes the vision rotary as rope_parameters {rope_type "axial", rope_theta}; 4.x
// wrote nothing and used 10000.
Status ReadVisionRope(JsonKeyReader& keys, Qwen2VlVisionConfig* c) {
  const nlohmann::json& rope = keys.Take("rope_parameters");
  if (rope.is_null()) return Status::Ok();
  if (!rope.is_object())
    return keys.Error("rope_parameters", "must be an object, not " + rope.dump());
  for (auto it = rope.begin(); it != rope.end(); ++it) {
    if (it.key() == "rope_type") {
      if (it.value() != "axial") {
        return keys.Error("rope_parameters", "rope_type " + it.value().dump() +
                                                 " is not supported by this engine's Qwen2-VL "
                                                 "vision tower (supported: axial)");
      }
    } else if (it.key() == "rope_theta") {
      if (!it.value().is_number() || !(it.value().get<double>() > 0)) {
        return keys.Error("rope_parameters",
                          "rope_theta must be a positive number, not " + it.value().dump());
      }
      c->rope_theta = it.value().get<double>();
    } else {
      return keys.Error("rope_parameters", "." + it.key() + " (" + it.value().dump() +
                                               ") is not read by this engine's Qwen2-VL vision "
                                               "tower, and it may change the rotary embedding");
    }
  }
  return Status::Ok();
}

}  // namespace

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
  // The hub's Qwen2-VL configs also carry in_chans and spatial_patch_size, which transformers
  // keeps without reading: they must agree with what it reads.
  for (auto [legacy, read_as, value] :
       {std::tuple<const char*, const char*, int64_t>{"in_chans", "in_channels", c.in_channels},
        {"spatial_patch_size", "patch_size", c.patch_size}}) {
    const nlohmann::json& v = keys.Take(legacy);
    if (!v.is_null() && v != value) {
      return keys.Error(legacy, "is " + v.dump() + " but the model reads " + std::to_string(value) +
                                    " (" + read_as + ")");
    }
  }
  if (const nlohmann::json& act = keys.Take("hidden_act"); !act.is_null()) {
    const std::optional<Activation> activation =
        ActivationFromName(act.is_string() ? act.get<std::string>() : act.dump());
    if (!activation || *activation == Activation::kRelu) {
      return keys.Error("hidden_act", act.dump() +
                                          " is not supported by this engine (supported: "
                                          "quick_gelu, gelu, gelu_pytorch_tanh, silu)");
    }
    c.hidden_act = *activation;
  }
  if (const nlohmann::json& range = keys.Take("initializer_range"); range.is_number()) {
    c.initializer_range = range.get<double>();
  }
  ENGINE_RETURN_IF_ERROR(ReadVisionRope(keys, &c));
  ENGINE_RETURN_IF_ERROR(keys.RefuseUnread(
      kNeutralVisionKeys, "is not supported by this engine's Qwen2-VL vision tower"));
  Status checked = c.Check();
  if (!checked.ok()) return InvalidArgumentError(where + ": " + checked.message());
  return c;
}

Qwen2VlVisionBlockImpl::Qwen2VlVisionBlockImpl(const Qwen2VlVisionConfig& config)
    : config_(config) {
  const int64_t d = config.embed_dim;
  norm1 = register_module("norm1", Norm(d));
  norm2 = register_module("norm2", Norm(d));
  auto attn = register_module("attn", std::make_shared<torch::nn::Module>());
  qkv = attn->register_module("qkv", engine::Linear(d, 3 * d, /*bias=*/true));
  proj = attn->register_module("proj", engine::Linear(d, d, /*bias=*/true));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", engine::Linear(d, d * config.mlp_ratio, /*bias=*/true));
  fc2 = mlp->register_module("fc2", engine::Linear(d * config.mlp_ratio, d, /*bias=*/true));
}

at::Tensor Qwen2VlVisionBlockImpl::Attention(const at::Tensor& x, const at::Tensor& cos,
                                             const at::Tensor& sin,
                                             const std::vector<int64_t>& frame_lengths) {
  const int64_t n = x.size(0), heads = config_.num_heads, head_dim = config_.head_dim();
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (KernelAttentionAvailable(x)) {
    // The engine's kernel: every patch sees its own frame's patches (one key range each), the
    // rotary embedding applied as q and k are read.
    const RotaryTables tables{cos.squeeze(1).unsqueeze(0).unsqueeze(0),
                              sin.squeeze(1).unsqueeze(0).unsqueeze(0)};
    const at::Tensor attended =
        KernelPackedCausalAttention(qkv->forward(x).unsqueeze(0), heads, heads, scale, 0, &tables,
                                    FrameKeyRanges(frame_lengths));
    return proj->forward(attended.squeeze(0).transpose(0, 1).reshape({n, heads * head_dim}));
  }
  const std::vector<at::Tensor> qkv_parts =
      qkv->forward(x).reshape({n, 3, heads, head_dim}).permute({1, 0, 2, 3}).unbind(0);
  auto rotate = [&](const at::Tensor& t) {
    const at::Tensor f = t.to(at::kFloat);
    return (f * cos + RotateHalf(f) * sin).to(t.scalar_type()).transpose(0, 1);  // [heads, n, d]
  };
  const at::Tensor q = rotate(qkv_parts[0]), k = rotate(qkv_parts[1]);
  const at::Tensor v = qkv_parts[2].transpose(0, 1);
  // Softmax attention of q, k, v ([..., heads, positions, head_dim]) within themselves.
  auto attend = [&](const at::Tensor& qf, const at::Tensor& kf, const at::Tensor& vf) {
    const at::Tensor scores = at::matmul(qf, kf.transpose(-1, -2)) * scale;
    return at::matmul(at::softmax(scores, -1, at::kFloat).to(qf.scalar_type()), vf);
  };
  const int64_t first = frame_lengths.empty() ? 0 : frame_lengths.front();
  const bool equal = std::all_of(frame_lengths.begin(), frame_lengths.end(),
                                 [&](int64_t length) { return length == first; });
  at::Tensor attended;  // [heads, n, head_dim]
  if (equal && first > 0) {
    // Frames of one size (a batch of same-sized images): one batched product per step, the same
    // arithmetic as frame by frame.
    const int64_t frames = n / first;
    auto by_frame = [&](const at::Tensor& t) {
      return t.reshape({heads, frames, first, head_dim}).transpose(0, 1);
    };
    attended =
        attend(by_frame(q), by_frame(k), by_frame(v)).transpose(0, 1).reshape({heads, n, head_dim});
  } else {
    std::vector<at::Tensor> outputs;
    int64_t start = 0;
    for (int64_t length : frame_lengths) {
      outputs.push_back(attend(q.narrow(1, start, length), k.narrow(1, start, length),
                               v.narrow(1, start, length)));
      start += length;
    }
    attended = at::cat(outputs, 1);
  }
  return proj->forward(attended.transpose(0, 1).reshape({n, heads * head_dim}));
}

at::Tensor Qwen2VlVisionBlockImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                           const at::Tensor& sin,
                                           const std::vector<int64_t>& frame_lengths) {
  const at::Tensor h = x + Attention(ApplyNorm(norm1, x), cos, sin, frame_lengths);
  return h + fc2->forward(Activate(fc1->forward(ApplyNorm(norm2, h)), config_.hidden_act));
}

Qwen2VlVisionTowerImpl::Qwen2VlVisionTowerImpl(const Qwen2VlVisionConfig& config)
    : config_(config) {
  const int64_t d = config.embed_dim, m = config.spatial_merge_size;
  auto patch_embed = register_module("patch_embed", std::make_shared<torch::nn::Module>());
  auto proj = patch_embed->register_module("proj", std::make_shared<torch::nn::Module>());
  patch_weight = proj->register_parameter(
      "weight", at::empty({d, config.in_channels, config.temporal_patch_size, config.patch_size,
                           config.patch_size}));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.depth; ++i) blocks->push_back(Qwen2VlVisionBlock(config));
  auto merger = register_module("merger", std::make_shared<torch::nn::Module>());
  ln_q = merger->register_module("ln_q", Norm(d));
  auto mlp = merger->register_module("mlp", std::make_shared<torch::nn::Module>());
  merger_fc1 = mlp->register_module("0", engine::Linear(d * m * m, d * m * m, /*bias=*/true));
  merger_fc2 =
      mlp->register_module("2", engine::Linear(d * m * m, config.hidden_size, /*bias=*/true));
}

void Qwen2VlVisionTowerImpl::Initialize() {
  at::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    const bool norm =
        name.find("norm") != std::string::npos || name.find("ln_q") != std::string::npos;
    if (norm) {
      p.value().fill_(name.size() >= 6 && name.substr(name.size() - 6) == "weight" ? 1.0 : 0.0);
    } else if (name.size() >= 4 && name.substr(name.size() - 4) == "bias") {
      p.value().zero_();
    } else {
      p.value().normal_(0, config_.initializer_range);
    }
  }
}

at::Tensor Qwen2VlVisionTowerImpl::forward(const at::Tensor& pixel_values,
                                           const std::vector<ImageGrid>& grids,
                                           bool checkpointing) {
  const at::Tensor weight = patch_weight.reshape({config_.embed_dim, -1});
  at::Tensor x = at::linear(pixel_values.to(weight.scalar_type()), weight);

  // The 2-D rotary angles: the first half of each head's frequencies from the patch's row, the
  // second from its column.
  const int64_t rotary_dim = config_.head_dim() / 2;
  const at::Tensor inv_freq =
      1.0 / at::pow(config_.rope_theta, at::arange(0, rotary_dim, 2, at::kFloat) / rotary_dim);
  int64_t largest = 0;
  std::vector<int64_t> frame_lengths;
  for (const ImageGrid& g : grids) {
    largest = std::max({largest, g.h, g.w});
    for (int64_t f = 0; f < g.t; ++f) frame_lengths.push_back(g.h * g.w);
  }
  const at::Tensor table = at::outer(at::arange(largest, at::kFloat), inv_freq);
  const at::Tensor rows_and_columns = PatchRowsAndColumns(grids, config_.spatial_merge_size);
  const at::Tensor angles =
      table.index_select(0, rows_and_columns.flatten()).reshape({rows_and_columns.size(0), -1});
  const at::Tensor both = at::cat({angles, angles}, -1).to(x.device()).unsqueeze(1);
  const at::Tensor cos = both.cos(), sin = both.sin();

  for (const auto& module : *blocks) {
    auto block = std::dynamic_pointer_cast<Qwen2VlVisionBlockImpl>(module);
    // By value: the recomputation in backward outlives this frame.
    auto run = [block, cos, sin, frame_lengths](const at::Tensor& h) {
      return block->forward(h, cos, sin, frame_lengths);
    };
    x = checkpointing ? engine::CheckpointedForward(run, x) : run(x);
  }
  const int64_t merged =
      config_.embed_dim * config_.spatial_merge_size * config_.spatial_merge_size;
  const at::Tensor groups = ApplyNorm(ln_q, x).reshape({-1, merged});
  return merger_fc2->forward(at::gelu(merger_fc1->forward(groups)));
}

}  // namespace engine::transformer
