// A synthetic Llama checkpoint for the benches: random bf16 weights with Hugging Face's names and
// a config.json, in TinyLlama-1.1B's shape by default (a 2.2 GB model.safetensors).
#pragma once

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/safetensors.h"

namespace bench {

struct Shape {
  int64_t hidden = 2048, intermediate = 5632, layers = 22, heads = 32, kv_heads = 4, vocab = 32000;
};

inline std::string ConfigJson(const Shape& s) {
  return "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], "
         "\"hidden_size\": " +
         std::to_string(s.hidden) + ", \"intermediate_size\": " + std::to_string(s.intermediate) +
         ", \"num_hidden_layers\": " + std::to_string(s.layers) +
         ", \"num_attention_heads\": " + std::to_string(s.heads) +
         ", \"num_key_value_heads\": " + std::to_string(s.kv_heads) +
         ", \"vocab_size\": " + std::to_string(s.vocab) +
         ", \"max_position_embeddings\": 2048, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, "
         "\"hidden_act\": \"silu\", \"tie_word_embeddings\": false, \"torch_dtype\": "
         "\"bfloat16\", \"bos_token_id\": 1, \"eos_token_id\": 2}";
}

// Random bf16 weights with Hugging Face's names; returns the file's size.
inline uintmax_t WriteSyntheticLlama(const std::filesystem::path& dir, const Shape& s) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << ConfigJson(s);
  engine::safetensors::NamedTensors tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> sizes, bool ones = false) {
    at::Tensor t = ones ? at::ones(sizes) : at::randn(sizes).mul_(0.02);
    tensors.emplace_back(name, t.to(at::kBFloat16));
  };
  const int64_t head_dim = s.hidden / s.heads;
  add("model.embed_tokens.weight", {s.vocab, s.hidden});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {s.hidden}, true);
    add(p + "post_attention_layernorm.weight", {s.hidden}, true);
    add(p + "self_attn.q_proj.weight", {s.heads * head_dim, s.hidden});
    add(p + "self_attn.k_proj.weight", {s.kv_heads * head_dim, s.hidden});
    add(p + "self_attn.v_proj.weight", {s.kv_heads * head_dim, s.hidden});
    add(p + "self_attn.o_proj.weight", {s.hidden, s.heads * head_dim});
    add(p + "mlp.gate_proj.weight", {s.intermediate, s.hidden});
    add(p + "mlp.up_proj.weight", {s.intermediate, s.hidden});
    add(p + "mlp.down_proj.weight", {s.hidden, s.intermediate});
  }
  add("model.norm.weight", {s.hidden}, true);
  add("lm_head.weight", {s.vocab, s.hidden});
  const engine::Status written = engine::safetensors::Write(dir / "model.safetensors", tensors, {});
  if (!written.ok()) {
    std::fprintf(stderr, "%s\n", written.message().c_str());
    std::exit(1);
  }
  return std::filesystem::file_size(dir / "model.safetensors");
}

}  // namespace bench
