#include "llama_modules.h"

#include <ATen/ATen.h>

#include <cmath>

#include "engine/activation_checkpoint.h"

namespace engine::transformer {
namespace {

engine::Linear Projection(int64_t in, int64_t out) {
  return engine::Linear(in, out, /*bias=*/false);
}

// [batch, kv_heads, positions, dim] -> [batch, kv_heads * groups, positions, dim].
at::Tensor RepeatKv(const at::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const auto s = x.sizes();
  return x.unsqueeze(2)
      .expand({s[0], s[1], groups, s[2], s[3]})
      .reshape({s[0], s[1] * groups, s[2], s[3]});
}

}  // namespace

RmsNormImpl::RmsNormImpl(int64_t size, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({size}));
}

at::Tensor RmsNormImpl::forward(const at::Tensor& x) {
  const at::Tensor f = x.to(at::kFloat);
  const at::Tensor normed = f * at::rsqrt(f.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * normed.to(x.scalar_type());
}

at::Tensor ApplyRotary(const at::Tensor& x, int64_t offset, double theta) {
  const int64_t positions = x.size(2);
  const int64_t dim = x.size(3);
  auto f32 = at::TensorOptions().dtype(at::kFloat).device(x.device());
  const at::Tensor inv_freq =
      1.0 / at::pow(theta, at::arange(0, dim, 2, f32) / static_cast<double>(dim));
  const at::Tensor t = at::arange(offset, offset + positions, f32);
  const at::Tensor freqs = at::outer(t, inv_freq);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);  // [positions, dim]
  const at::Tensor cos = emb.cos().to(x.scalar_type());
  const at::Tensor sin = emb.sin().to(x.scalar_type());
  const at::Tensor first = x.narrow(-1, 0, dim / 2);
  const at::Tensor second = x.narrow(-1, dim / 2, dim / 2);
  const at::Tensor rotated = at::cat({-second, first}, -1);
  return x * cos + rotated * sin;
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& config) : config_(config) {
  const int64_t h = config.hidden_size, d = config.head_dim();
  q_proj = register_module("q_proj", Projection(h, config.num_attention_heads * d));
  k_proj = register_module("k_proj", Projection(h, config.num_key_value_heads * d));
  v_proj = register_module("v_proj", Projection(h, config.num_key_value_heads * d));
  o_proj = register_module("o_proj", Projection(config.num_attention_heads * d, h));
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, int64_t offset, LayerCache* cache) {
  const int64_t batch = x.size(0), positions = x.size(1), d = config_.head_dim();
  const int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  at::Tensor q = q_proj->forward(x).view({batch, positions, heads, d}).transpose(1, 2);
  at::Tensor k = k_proj->forward(x).view({batch, positions, kv_heads, d}).transpose(1, 2);
  at::Tensor v = v_proj->forward(x).view({batch, positions, kv_heads, d}).transpose(1, 2);
  q = ApplyRotary(q, offset, config_.rope_theta);
  k = ApplyRotary(k, offset, config_.rope_theta);
  if (cache != nullptr) {
    if (cache->key.defined()) {
      k = at::cat({cache->key, k.to(cache->key.scalar_type())}, 2);
      v = at::cat({cache->value, v.to(cache->value.scalar_type())}, 2);
    }
    cache->key = k;
    cache->value = v;
  }
  k = RepeatKv(k, heads / kv_heads);
  v = RepeatKv(v, heads / kv_heads);
  const int64_t total = k.size(2);
  at::Tensor scores = at::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(d));
  if (positions > 1) {
    // Query i (at position offset + i) sees keys up to offset + i.
    const auto options = at::TensorOptions().dtype(at::kLong).device(x.device());
    const at::Tensor rows = at::arange(offset, offset + positions, options).unsqueeze(1);
    const at::Tensor cols = at::arange(total, options).unsqueeze(0);
    scores = scores.masked_fill(cols > rows, -std::numeric_limits<float>::infinity());
  }
  const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(v.scalar_type());
  const at::Tensor out =
      at::matmul(probs, v).transpose(1, 2).reshape({batch, positions, heads * d});
  return o_proj->forward(out);
}

LlamaMlpImpl::LlamaMlpImpl(const LlamaConfig& config) {
  gate_proj =
      register_module("gate_proj", Projection(config.hidden_size, config.intermediate_size));
  up_proj = register_module("up_proj", Projection(config.hidden_size, config.intermediate_size));
  down_proj =
      register_module("down_proj", Projection(config.intermediate_size, config.hidden_size));
}

at::Tensor LlamaMlpImpl::forward(const at::Tensor& x) {
  return down_proj->forward(at::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

LlamaBlockImpl::LlamaBlockImpl(const LlamaConfig& config) {
  input_layernorm =
      register_module("input_layernorm", RmsNorm(config.hidden_size, config.rms_norm_eps));
  self_attn = register_module("self_attn", LlamaAttention(config));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(config.hidden_size, config.rms_norm_eps));
  mlp = register_module("mlp", LlamaMlp(config));
}

at::Tensor LlamaBlockImpl::forward(const at::Tensor& x, int64_t offset, LayerCache* cache) {
  const at::Tensor h = x + self_attn->forward(input_layernorm->forward(x), offset, cache);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

LlamaDecoderImpl::LlamaDecoderImpl(const LlamaConfig& config) : config_(config) {
  embed_tokens =
      register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(LlamaBlock(config));
  norm = register_module("norm", RmsNorm(config.hidden_size, config.rms_norm_eps));
}

at::Tensor LlamaDecoderImpl::Embed(const at::Tensor& ids) { return embed_tokens->forward(ids); }

at::Tensor LlamaDecoderImpl::forward(const at::Tensor& embeds, int64_t offset, KvCache* cache,
                                     bool checkpointing) {
  if (cache != nullptr && cache->size() != layers->size()) cache->resize(layers->size());
  at::Tensor h = embeds;
  for (size_t i = 0; i < layers->size(); ++i) {
    auto block = layers[i]->as<LlamaBlockImpl>();
    LayerCache* layer_cache = cache != nullptr ? &(*cache)[i] : nullptr;
    if (checkpointing && layer_cache == nullptr) {
      h = CheckpointedForward(
          [block, offset](const at::Tensor& x) { return block->forward(x, offset, nullptr); }, h);
    } else {
      h = block->forward(h, offset, layer_cache);
    }
  }
  return norm->forward(h);
}

CausalLm::CausalLm(torch::nn::Module& owner, const LlamaConfig& config) {
  model = owner.register_module("model", LlamaDecoder(config));
  if (!config.tie_word_embeddings) {
    lm_head = owner.register_module("lm_head", Projection(config.hidden_size, config.vocab_size));
  }
}

at::Tensor CausalLm::Logits(const at::Tensor& hidden) {
  if (lm_head) return lm_head->forward(hidden);
  return at::matmul(hidden, model->embed_tokens->weight.t());
}

at::Tensor CausalLm::Generate(const at::Tensor& prefix, int64_t max_new_tokens, int64_t eos_id,
                              bool use_cache) {
  at::NoGradGuard no_grad;
  const int64_t batch = prefix.size(0);
  std::vector<at::Tensor> generated;
  at::Tensor finished =
      at::zeros({batch}, at::TensorOptions().dtype(at::kBool).device(prefix.device()));
  KvCache cache;
  at::Tensor sequence = prefix;
  at::Tensor hidden = model->forward(prefix, 0, use_cache ? &cache : nullptr);
  int64_t length = prefix.size(1);
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    at::Tensor next = Logits(hidden.select(1, hidden.size(1) - 1)).argmax(-1);
    if (eos_id >= 0) next = at::where(finished, at::full_like(next, eos_id), next);
    generated.push_back(next);
    if (eos_id >= 0) finished = finished | next.eq(eos_id);
    if (step + 1 == max_new_tokens || (eos_id >= 0 && finished.all().item<bool>())) break;
    const at::Tensor embedded = model->Embed(next.unsqueeze(1)).to(prefix.scalar_type());
    if (use_cache) {
      hidden = model->forward(embedded, length, &cache);
    } else {
      sequence = at::cat({sequence, embedded}, 1);
      hidden = model->forward(sequence, 0, nullptr);
    }
    ++length;
  }
  return at::stack(generated, 1);
}

void InitializeWeights(torch::nn::Module& module, double initializer_range) {
  at::NoGradGuard no_grad;
  for (auto& p : module.named_parameters(/*recurse=*/true)) {
    const std::string& name = p.key();
    const bool norm = name.find("norm") != std::string::npos;
    if (norm && name.size() >= 7 && name.compare(name.size() - 7, 7, ".weight") == 0) {
      p.value().fill_(1.0);
    } else if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.value().zero_();
    } else {
      p.value().normal_(0.0, initializer_range);
    }
  }
}

}  // namespace engine::transformer
