#include "rotary.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

namespace engine::transformer {
namespace {

// Llama 3's smoothing: long wavelengths divided by the factor, short ones kept, the band between
// interpolated (transformers' _compute_llama3_parameters).
at::Tensor Llama3Frequencies(const at::Tensor& inv_freq, const RopeScaling& s) {
  const double old_context = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  const at::Tensor wavelen = 2 * M_PI / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  const at::Tensor smooth =
      (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

// Qwen2-VL: emb [3, batch, positions, dim] -> [batch, positions, dim], the dimension cut into the
// bands of mrope_section (twice, for the two halves) and band i taken from axis i % 3 (temporal,
// height, width).
at::Tensor MultimodalBands(const at::Tensor& emb, const std::vector<int64_t>& section) {
  TORCH_CHECK(section.size() == 3, "3-axis positions need a three-band mrope_section");
  std::vector<at::Tensor> bands;
  int64_t start = 0;
  for (int half = 0; half < 2; ++half) {
    for (size_t axis = 0; axis < 3; ++axis) {
      bands.push_back(emb[static_cast<int64_t>(axis)].narrow(-1, start, section[axis]));
      start += section[axis];
    }
  }
  return at::cat(bands, -1);
}

// Qwen3-VL: freqs [3, batch, positions, dim / 2] -> [batch, positions, dim / 2], frequency i from
// the height positions when i % 3 == 1 and i < 3 x section[1], from the width positions when
// i % 3 == 2 and i < 3 x section[2], from the temporal ones otherwise (transformers'
// Qwen3VLTextRotaryEmbedding.recomposition_frequencies).
at::Tensor InterleavedBands(const at::Tensor& freqs, const std::vector<int64_t>& section) {
  TORCH_CHECK(section.size() == 3, "3-axis positions need a three-band mrope_section");
  const int64_t half = freqs.size(-1);
  std::vector<int64_t> axis_of(static_cast<size_t>(half), 0);
  for (int64_t axis = 1; axis < 3; ++axis) {
    for (int64_t i = axis; i < std::min(half, 3 * section[axis]); i += 3) axis_of[i] = axis;
  }
  // One gather along the axis dimension: [1, batch, positions, dim / 2] of axis indices.
  const at::Tensor axes = at::tensor(axis_of, at::kLong)
                              .to(freqs.device())
                              .view({1, 1, 1, half})
                              .expand({1, freqs.size(1), freqs.size(2), half});
  return freqs.gather(0, axes).squeeze(0);
}

}  // namespace

at::Tensor InverseFrequencies(const LlamaConfig& config, int64_t seq_len,
                              const at::Device& device) {
  const int64_t dim = config.head_dim();
  const RopeScaling& s = config.rope_scaling;
  double base = config.rope_theta;
  if (s.type == RopeScaling::Type::kDynamic && seq_len > config.max_position_embeddings) {
    base *= std::pow(s.factor * static_cast<double>(seq_len) /
                             static_cast<double>(config.max_position_embeddings) -
                         (s.factor - 1),
                     static_cast<double>(dim) / static_cast<double>(dim - 2));
  }
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor inv_freq =
      1.0 / at::pow(base, at::arange(0, dim, 2, f32.dtype(at::kLong)).to(at::kFloat) /
                              static_cast<double>(dim));
  if (s.type == RopeScaling::Type::kLinear) inv_freq = inv_freq / s.factor;
  if (s.type == RopeScaling::Type::kLlama3) inv_freq = Llama3Frequencies(inv_freq, s);
  return inv_freq;
}

RotaryTables BuildRotaryTables(const LlamaConfig& config, const at::Tensor& position_ids,
                               at::ScalarType dtype) {
  // Only dynamic scaling depends on the length, and reading it synchronises with the device.
  const bool dynamic = config.rope_scaling.type == RopeScaling::Type::kDynamic;
  const int64_t seq_len =
      dynamic && position_ids.numel() > 0 ? position_ids.max().item<int64_t>() + 1 : 0;
  const at::Tensor inv_freq = InverseFrequencies(config, seq_len, position_ids.device());
  // [(3,) batch, positions, dim / 2]: one f32 product per angle, as transformers' outer product.
  at::Tensor freqs = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq;
  if (position_ids.dim() == 3 && config.mrope_interleaved) {
    freqs = InterleavedBands(freqs, config.mrope_section);
  }
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  if (position_ids.dim() == 3 && !config.mrope_interleaved) {
    emb = MultimodalBands(emb, config.mrope_section);
  }
  emb = emb.unsqueeze(1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor ApplyRotary(const at::Tensor& x, const RotaryTables& tables) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * tables.cos + rotated * tables.sin;
}

}  // namespace engine::transformer
