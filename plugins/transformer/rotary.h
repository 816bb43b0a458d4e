// Rotary position embeddings as transformers computes them (modeling_rope_utils.py and the models'
// rotary classes): the inverse frequencies of the config's rope type, and the cos/sin tables of a
// batch's positions, built once per forward and shared by every layer.
//
// Dynamic NTK scaling depends on the batch: its base is rescaled for max(position_ids) + 1
// positions when that exceeds max_position_embeddings, as a freshly loaded transformers model
// computes it (transformers also keeps a grown base for later, shorter batches; this engine does
// not carry that history between batches).
#pragma once

#include <ATen/core/Tensor.h>

#include "llama_config.h"

namespace engine::transformer {

// cos and sin of every position's angles, [batch or 1, 1, positions, head_dim], in the dtype of the
// queries they rotate.
struct RotaryTables {
  at::Tensor cos;
  at::Tensor sin;
};

// inv_freq, f32 [head_dim / 2], for sequences of `seq_len` positions (only dynamic scaling reads
// it).
at::Tensor InverseFrequencies(const LlamaConfig& config, int64_t seq_len, const at::Device& device);

// The tables for `position_ids`: i64 [batch or 1, positions], or [3, batch, positions] (temporal,
// height, width) for a config with mrope_section.
RotaryTables BuildRotaryTables(const LlamaConfig& config, const at::Tensor& position_ids,
                               at::ScalarType dtype);

// Rotates the last dimension of `x` ([batch, heads, positions, head_dim]).
at::Tensor ApplyRotary(const at::Tensor& x, const RotaryTables& tables);

}  // namespace engine::transformer
