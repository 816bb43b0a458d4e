#include "qwen_vision_parts.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "kernel_ops.h"

namespace engine::transformer {
namespace {

// Every patch's keys: its segment's patches, as int32 [1, patches, 2] (first, end) for the
// attention kernel.
at::Tensor SegmentKeyRanges(const std::vector<int64_t>& segment_lengths) {
  std::vector<int32_t> ranges;
  int64_t start = 0;
  for (int64_t length : segment_lengths) {
    for (int64_t i = 0; i < length; ++i) {
      ranges.push_back(static_cast<int32_t>(start));
      ranges.push_back(static_cast<int32_t>(start + length));
    }
    start += length;
  }
  return at::tensor(ranges, at::kInt).view({1, start, 2});
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

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

at::Tensor RegisterPatchEmbedding(torch::nn::Module& tower, int64_t embed_dim, int64_t in_channels,
                                  int64_t temporal_patch_size, int64_t patch_size,
                                  at::Tensor* bias_out) {
  auto patch_embed = tower.register_module("patch_embed", std::make_shared<torch::nn::Module>());
  auto proj = patch_embed->register_module("proj", std::make_shared<torch::nn::Module>());
  at::Tensor weight = proj->register_parameter(
      "weight", at::empty({embed_dim, in_channels, temporal_patch_size, patch_size, patch_size}));
  if (bias_out != nullptr) *bias_out = proj->register_parameter("bias", at::empty({embed_dim}));
  return weight;
}

at::Tensor EmbedPatches(const at::Tensor& patch_weight, const at::Tensor& pixel_values,
                        const at::Tensor& patch_bias) {
  const at::Tensor weight = patch_weight.reshape({patch_weight.size(0), -1});
  return at::linear(pixel_values.to(weight.scalar_type()), weight, patch_bias);
}

std::vector<int64_t> FrameLengths(const std::vector<ImageGrid>& grids) {
  std::vector<int64_t> lengths;
  for (const ImageGrid& g : grids) {
    for (int64_t f = 0; f < g.t; ++f) lengths.push_back(g.h * g.w);
  }
  return lengths;
}

VisionRotary QwenVisionRotary(const std::vector<ImageGrid>& grids, int64_t spatial_merge_size,
                              int64_t head_dim, double theta, const at::Device& device) {
  const int64_t rotary_dim = head_dim / 2;
  const at::Tensor inv_freq =
      1.0 / at::pow(theta, at::arange(0, rotary_dim, 2, at::kFloat) / rotary_dim);
  int64_t largest = 0;
  for (const ImageGrid& g : grids) largest = std::max({largest, g.h, g.w});
  const at::Tensor table = at::outer(at::arange(largest, at::kFloat), inv_freq);
  const at::Tensor rows_and_columns = PatchRowsAndColumns(grids, spatial_merge_size);
  const at::Tensor angles =
      table.index_select(0, rows_and_columns.flatten()).reshape({rows_and_columns.size(0), -1});
  const at::Tensor both = at::cat({angles, angles}, -1).to(device).unsqueeze(1);
  return {both.cos(), both.sin()};
}

at::Tensor PermuteMergedGroups(const at::Tensor& t, const at::Tensor& order, int64_t group) {
  std::vector<int64_t> grouped = {t.size(0) / group, group};
  for (int64_t d = 1; d < t.dim(); ++d) grouped.push_back(t.size(d));
  return t.reshape(grouped).index_select(0, order.to(t.device())).reshape(t.sizes());
}

at::Tensor SegmentedVisionAttention(const at::Tensor& qkv, int64_t heads,
                                    const VisionRotary& rotary,
                                    const std::vector<int64_t>& segment_lengths) {
  const int64_t n = qkv.size(0), head_dim = qkv.size(1) / (3 * heads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (KernelAttentionAvailable(qkv)) {
    // The engine's kernel: every patch sees its own segment's patches (one key range each), the
    // rotary embedding applied as q and k are read.
    const RotaryTables tables{rotary.cos.squeeze(1).unsqueeze(0).unsqueeze(0),
                              rotary.sin.squeeze(1).unsqueeze(0).unsqueeze(0)};
    const at::Tensor attended = KernelPackedCausalAttention(
        qkv.unsqueeze(0), heads, heads, scale, 0, &tables, SegmentKeyRanges(segment_lengths));
    return attended.squeeze(0).transpose(0, 1).reshape({n, heads * head_dim});
  }
  const std::vector<at::Tensor> qkv_parts =
      qkv.reshape({n, 3, heads, head_dim}).permute({1, 0, 2, 3}).unbind(0);
  auto rotate = [&](const at::Tensor& t) {
    const at::Tensor f = t.to(at::kFloat);
    return (f * rotary.cos + RotateHalf(f) * rotary.sin).to(t.scalar_type()).transpose(0, 1);
  };
  const at::Tensor q = rotate(qkv_parts[0]), k = rotate(qkv_parts[1]);  // [heads, n, head_dim]
  const at::Tensor v = qkv_parts[2].transpose(0, 1);
  // Softmax attention of q, k, v ([..., heads, positions, head_dim]) within themselves.
  auto attend = [&](const at::Tensor& qf, const at::Tensor& kf, const at::Tensor& vf) {
    const at::Tensor scores = at::matmul(qf, kf.transpose(-1, -2)) * scale;
    return at::matmul(at::softmax(scores, -1, at::kFloat).to(qf.scalar_type()), vf);
  };
  const int64_t first = segment_lengths.empty() ? 0 : segment_lengths.front();
  const bool equal = std::all_of(segment_lengths.begin(), segment_lengths.end(),
                                 [&](int64_t length) { return length == first; });
  at::Tensor attended;  // [heads, n, head_dim]
  if (equal && first > 0) {
    // Segments of one size (a batch of same-sized images): one batched product per step, the same
    // arithmetic as segment by segment.
    const int64_t segments = n / first;
    auto by_segment = [&](const at::Tensor& t) {
      return t.reshape({heads, segments, first, head_dim}).transpose(0, 1);
    };
    attended = attend(by_segment(q), by_segment(k), by_segment(v))
                   .transpose(0, 1)
                   .reshape({heads, n, head_dim});
  } else {
    std::vector<at::Tensor> outputs;
    int64_t start = 0;
    for (int64_t length : segment_lengths) {
      outputs.push_back(attend(q.narrow(1, start, length), k.narrow(1, start, length),
                               v.narrow(1, start, length)));
      start += length;
    }
    attended = at::cat(outputs, 1);
  }
  return attended.transpose(0, 1).reshape({n, heads * head_dim});
}

void InitializeQwenVision(torch::nn::Module& tower, double initializer_range) {
  at::NoGradGuard no_grad;
  for (auto& p : tower.named_parameters()) {
    const std::string& name = p.key();
    const bool norm =
        name.find("norm") != std::string::npos || name.find("ln_q") != std::string::npos;
    if (norm) {
      p.value().fill_(EndsWith(name, "weight") ? 1.0 : 0.0);
    } else if (EndsWith(name, "bias")) {
      p.value().zero_();
    } else {
      p.value().normal_(0, initializer_range);
    }
  }
}

Status ReadVisionActivation(JsonKeyReader& keys, Activation* activation) {
  const nlohmann::json& act = keys.Take("hidden_act");
  if (act.is_null()) return Status::Ok();
  const std::optional<Activation> named =
      ActivationFromName(act.is_string() ? act.get<std::string>() : act.dump());
  if (!named || *named == Activation::kRelu) {
    return keys.Error("hidden_act", act.dump() +
                                        " is not supported by this engine (supported: "
                                        "quick_gelu, gelu, gelu_pytorch_tanh, silu)");
  }
  *activation = *named;
  return Status::Ok();
}

Status ReadVisionRope(JsonKeyReader& keys, double* theta) {
  const nlohmann::json& rope = keys.Take("rope_parameters");
  if (rope.is_null()) return Status::Ok();
  if (!rope.is_object())
    return keys.Error("rope_parameters", "must be an object, not " + rope.dump());
  for (auto it = rope.begin(); it != rope.end(); ++it) {
    if (it.key() == "rope_type") {
      if (it.value() != "axial") {
        return keys.Error("rope_parameters", "rope_type " + it.value().dump() +
                                                 " is not supported by this engine's vision "
                                                 "towers (supported: axial)");
      }
    } else if (it.key() == "rope_theta") {
      if (!it.value().is_number() || !(it.value().get<double>() > 0)) {
        return keys.Error("rope_parameters",
                          "rope_theta must be a positive number, not " + it.value().dump());
      }
      *theta = it.value().get<double>();
    } else {
      return keys.Error("rope_parameters", "." + it.key() + " (" + it.value().dump() +
                                               ") is not read by this engine's vision towers, "
                                               "and it may change the rotary embedding");
    }
  }
  return Status::Ok();
}

Status ReadVisionBlockList(JsonKeyReader& keys, const std::string& key, int64_t depth,
                           std::vector<int64_t>* blocks) {
  const nlohmann::json& v = keys.Take(key);
  if (v.is_null()) return Status::Ok();
  if (!v.is_array()) return keys.Error(key, "must be a list, not " + v.dump());
  blocks->clear();
  for (const nlohmann::json& index : v) {
    if (!index.is_number_integer() || index.get<int64_t>() < 0 || index.get<int64_t>() >= depth) {
      return keys.Error(key, "holds " + index.dump() +
                                 ", not a block of the tower (0 to depth - 1 = " +
                                 std::to_string(depth - 1) + ")");
    }
    blocks->push_back(index.get<int64_t>());
  }
  return Status::Ok();
}

Status CheckUnreadVisionCopies(JsonKeyReader& keys, int64_t in_channels, int64_t patch_size) {
  for (auto [copy, read_as, value] :
       {std::tuple<const char*, const char*, int64_t>{"in_chans", "in_channels", in_channels},
        {"spatial_patch_size", "patch_size", patch_size}}) {
    const nlohmann::json& v = keys.Take(copy);
    if (!v.is_null() && v != value) {
      return keys.Error(copy, "is " + v.dump() + " but the model reads " + std::to_string(value) +
                                  " (" + read_as + ")");
    }
  }
  return Status::Ok();
}

}  // namespace engine::transformer
