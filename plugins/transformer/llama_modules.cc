#include "llama_modules.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>

#include "attention_mask.h"
#include "engine/linear.h"
#include "engine/model_block.h"
#include "engine/torch_compat.h"
#include "kernel_ops.h"

namespace engine::transformer {
namespace {

engine::Linear Projection(int64_t in, int64_t out, bool bias = false) {
  return engine::Linear(in, out, bias);
}

// The lowest finite value of a floating dtype, as transformers' finfo(dtype).min.
at::Scalar Lowest(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return at::Scalar(static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest()));
    case at::kHalf:
      return at::Scalar(static_cast<double>(std::numeric_limits<c10::Half>::lowest()));
    case at::kDouble:
      return at::Scalar(std::numeric_limits<double>::lowest());
    default:
      return at::Scalar(std::numeric_limits<float>::lowest());
  }
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

at::Tensor Activate(const at::Tensor& x, Activation activation) {
  switch (activation) {
    case Activation::kGelu:
      return at::gelu(x);
    case Activation::kGeluTanh:
      return at::gelu(x, "tanh");
    case Activation::kRelu:
      return at::relu(x);
    case Activation::kQuickGelu:
      return x * at::sigmoid(1.702 * x);
    case Activation::kSilu:
      break;
  }
  return at::silu(x);
}

RmsNormImpl::RmsNormImpl(int64_t size, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({size}));
}

at::Tensor RmsNormImpl::forward(const at::Tensor& x) {
  if (KernelRmsNormTakes(x, weight)) return KernelRmsNorm(x, weight, eps_);
  const at::Tensor f = x.to(at::kFloat);
  const at::Tensor normed = f * at::rsqrt(f.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * normed.to(x.scalar_type());
}

AttentionContext BuildAttentionContext(const LlamaConfig& config, const DecoderInputs& inputs,
                                       int64_t positions, at::ScalarType dtype,
                                       const at::Device& device) {
  AttentionContext context;
  const at::Tensor position_ids =
      inputs.position_ids.defined()
          ? inputs.position_ids.to(device)
          : PositionIds(inputs.attention_mask, positions, inputs.offset, device);
  context.rotary = BuildRotaryTables(config, position_ids, dtype);
  context.full_mask =
      BuildAttentionMask(inputs.attention_mask, positions, inputs.offset, /*window=*/0, device);
  if (config.sliding_window > 0) {
    context.sliding_mask = BuildAttentionMask(inputs.attention_mask, positions, inputs.offset,
                                              config.sliding_window, device);
  }
  if (inputs.attention_mask.defined() && inputs.offset == 0 && device.is_cpu() &&
      KernelAttentionSwitchedOn()) {
    const int64_t batch = inputs.attention_mask.size(0);
    if (context.full_mask.defined()) context.full_ranges = KeyRanges(context.full_mask, batch);
    if (context.sliding_mask.defined()) {
      context.sliding_ranges = KeyRanges(context.sliding_mask, batch);
    }
  }
  context.full_is_causal = !inputs.attention_mask.defined() && inputs.offset == 0 && positions > 1;
  context.sliding_is_causal =
      context.full_is_causal && (config.sliding_window <= 0 || positions <= config.sliding_window);
  context.fused = FusedAttention();
  return context;
}

bool FusedAttention() {
  // Read at every call (once per forward), so that a test can compare both paths.
  const char* choice = std::getenv("ENGINE_ATTENTION");
  return compat::HasScaledDotProductAttention() &&
         (choice == nullptr || std::string(choice) != "math");
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& config, bool slides)
    : config_(config), slides_(slides) {
  const int64_t h = config.hidden_size, d = config.head_dim();
  const int64_t heads = config.num_attention_heads, kv_heads = config.num_key_value_heads;
  q_proj = register_module("q_proj", Projection(h, heads * d, config.qkv_bias));
  k_proj = register_module("k_proj", Projection(h, kv_heads * d, config.qkv_bias));
  v_proj = register_module("v_proj", Projection(h, kv_heads * d, config.qkv_bias));
  o_proj = register_module("o_proj", Projection(heads * d, h, config.o_bias));
  if (config.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RmsNormImpl>(d, config.rms_norm_eps));
    k_norm = register_module("k_norm", std::make_shared<RmsNormImpl>(d, config.rms_norm_eps));
  }
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, int64_t offset, LayerCache* cache) {
  DecoderInputs inputs;
  inputs.offset = offset;
  return forward(x, BuildAttentionContext(config_, inputs, x.size(1), x.scalar_type(), x.device()),
                 cache);
}

int64_t LlamaAttentionImpl::Window() const { return slides_ ? config_.sliding_window : 0; }

at::Tensor LlamaAttentionImpl::KernelForward(const at::Tensor& x, const AttentionContext& context) {
  const int64_t batch = x.size(0), positions = x.size(1), d = config_.head_dim();
  const int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // Padded or packed rows: their ranges (which hold the window too); else causal in the window.
  const at::Tensor& ranges = slides_ ? context.sliding_ranges : context.full_ranges;
  const at::Tensor qkv = ForwardConcatenated({q_proj.get(), k_proj.get(), v_proj.get()}, x);
  at::Tensor attended;
  if (qkv.defined()) {
    attended =
        KernelPackedCausalAttention(qkv, heads, kv_heads, scale, Window(), &context.rotary, ranges);
  } else {  // adapters or quantized weights: the projections one by one
    const auto heads_of = [&](engine::Linear& projection, int64_t count) {
      return projection->forward(x).view({batch, positions, count, d}).transpose(1, 2);
    };
    attended =
        KernelCausalAttention(heads_of(q_proj, heads), heads_of(k_proj, kv_heads),
                              heads_of(v_proj, kv_heads), scale, Window(), &context.rotary, ranges);
  }
  return o_proj->forward(attended.transpose(1, 2).reshape({batch, positions, heads * d}));
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const AttentionContext& context,
                                       LayerCache* cache) {
  // Causal, no cache to fill, no per-head norm between projection and rotary: projections,
  // rotary and attention in the engine's kernels.
  const bool kernel_mask =
      context.full_is_causal || (slides_ ? context.sliding_ranges : context.full_ranges).defined();
  if (cache == nullptr && !q_norm && kernel_mask && KernelAttentionAvailable(x)) {
    return KernelForward(x, context);
  }
  const int64_t batch = x.size(0), positions = x.size(1), d = config_.head_dim();
  const int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  at::Tensor q = q_proj->forward(x).view({batch, positions, heads, d});
  at::Tensor k = k_proj->forward(x).view({batch, positions, kv_heads, d});
  at::Tensor v = v_proj->forward(x).view({batch, positions, kv_heads, d}).transpose(1, 2);
  if (q_norm) {  // per head, before rotary
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  q = ApplyRotary(q.transpose(1, 2), context.rotary);
  k = ApplyRotary(k.transpose(1, 2), context.rotary);
  if (cache != nullptr) {
    if (cache->key.defined()) {
      k = at::cat({cache->key, k.to(cache->key.scalar_type())}, 2);
      v = at::cat({cache->value, v.to(cache->value.scalar_type())}, 2);
    }
    cache->key = k;
    cache->value = v;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  at::Tensor attended;
  if (context.full_is_causal && k.size(2) == positions && KernelAttentionTakes(q, k, v)) {
    // Causal, nothing cached before: the engine's kernel, grouped heads read in place.
    attended = KernelCausalAttention(q, k, v, scale, Window());
    return o_proj->forward(attended.transpose(1, 2).reshape({batch, positions, heads * d}));
  }
  k = RepeatKv(k, heads / kv_heads);
  v = RepeatKv(v, heads / kv_heads);
  const at::Tensor& mask = slides_ ? context.sliding_mask : context.full_mask;
  if (context.fused) {
    const bool causal = slides_ ? context.sliding_is_causal : context.full_is_causal;
    at::Tensor& bias = slides_ ? context.sliding_bias : context.full_bias;
    if (!causal && mask.defined() && (!bias.defined() || bias.scalar_type() != q.scalar_type())) {
      // The lowest finite value, as on the math path (a query that sees nothing gets a uniform
      // softmax, not NaN).
      bias = at::zeros(mask.sizes(), q.options()).masked_fill(mask, Lowest(q.scalar_type()));
    }
    attended = compat::ScaledDotProductAttention(q, k.to(q.scalar_type()), v.to(q.scalar_type()),
                                                 causal ? at::Tensor() : bias, causal, scale);
  } else {
    // Scaled by a multiply, as transformers scales.
    at::Tensor scores = at::matmul(q, k.transpose(2, 3)) * scale;
    if (mask.defined()) {
      // The lowest finite value, not -inf: a query that sees nothing (a padding row) gets a
      // uniform softmax instead of NaN, which the zero weights of masked keys would otherwise
      // spread.
      scores = scores.masked_fill(mask, Lowest(scores.scalar_type()));
    }
    const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(v.scalar_type());
    attended = at::matmul(probs, v);
  }
  return o_proj->forward(attended.transpose(1, 2).reshape({batch, positions, heads * d}));
}

LlamaMlpImpl::LlamaMlpImpl(const LlamaConfig& config)
    : LlamaMlpImpl(config.hidden_size, config.intermediate_size, config.mlp_bias,
                   config.hidden_act) {}

LlamaMlpImpl::LlamaMlpImpl(int64_t hidden, int64_t intermediate, bool bias, Activation activation)
    : activation_(activation) {
  gate_proj = register_module("gate_proj", Projection(hidden, intermediate, bias));
  up_proj = register_module("up_proj", Projection(hidden, intermediate, bias));
  down_proj = register_module("down_proj", Projection(intermediate, hidden, bias));
}

at::Tensor LlamaMlpImpl::forward(const at::Tensor& x) {
  if (activation_ == Activation::kSilu && x.device().is_cpu()) {
    const at::Tensor gate_up = ForwardConcatenated({gate_proj.get(), up_proj.get()}, x);
    if (gate_up.defined()) {
      if (KernelPackedSwiGluTakes(gate_up)) return down_proj->forward(KernelPackedSwiGlu(gate_up));
      const int64_t i = gate_up.size(-1) / 2;
      return down_proj->forward(at::silu(gate_up.narrow(-1, 0, i)) * gate_up.narrow(-1, i, i));
    }
  }
  const at::Tensor gate = gate_proj->forward(x), up = up_proj->forward(x);
  if (activation_ == Activation::kSilu && KernelSwiGluTakes(gate, up)) {
    return down_proj->forward(KernelSwiGlu(gate, up));
  }
  return down_proj->forward(Activate(gate, activation_) * up);
}

LlamaBlockImpl::LlamaBlockImpl(const LlamaConfig& config, int64_t layer) {
  input_layernorm =
      register_module("input_layernorm", RmsNorm(config.hidden_size, config.rms_norm_eps));
  self_attn = register_module("self_attn", LlamaAttention(config, config.LayerSlides(layer)));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(config.hidden_size, config.rms_norm_eps));
  mlp = register_module("mlp", LlamaMlp(config));
}

at::Tensor LlamaBlockImpl::forward(const at::Tensor& x, const AttentionContext& context,
                                   LayerCache* cache) {
  const at::Tensor h = x + self_attn->forward(input_layernorm->forward(x), context, cache);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

LlamaDecoderImpl::LlamaDecoderImpl(const LlamaConfig& config) : config_(config) {
  torch::nn::EmbeddingOptions embedding(config.vocab_size, config.hidden_size);
  // Weights a checkpoint replaces next are not drawn (engine/linear.h).
  if (UninitializedParametersScope::active()) {
    embedding._weight(at::empty({config.vocab_size, config.hidden_size}));
  }
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(embedding));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(LlamaBlock(config, i));
  norm = register_module("norm", RmsNorm(config.hidden_size, config.rms_norm_eps));
}

at::Tensor LlamaDecoderImpl::Embed(const at::Tensor& ids) { return embed_tokens->forward(ids); }

at::Tensor LlamaDecoderImpl::forward(const at::Tensor& embeds, int64_t offset, KvCache* cache,
                                     bool checkpointing) {
  DecoderInputs inputs;
  inputs.offset = offset;
  return Forward(embeds, inputs, cache, checkpointing);
}

at::Tensor LlamaDecoderImpl::Forward(const at::Tensor& embeds, const DecoderInputs& inputs,
                                     KvCache* cache, bool checkpointing) {
  if (cache != nullptr && cache->size() != layers->size()) cache->resize(layers->size());
  const AttentionContext context =
      BuildAttentionContext(config_, inputs, embeds.size(1), embeds.scalar_type(), embeds.device());
  at::Tensor h = embeds;
  for (size_t i = 0; i < layers->size(); ++i) {
    auto block = layers[i]->as<LlamaBlockImpl>();
    LayerCache* layer_cache = cache != nullptr ? &(*cache)[i] : nullptr;
    if (layer_cache == nullptr) {
      h = RunBlock(
          *block,
          [block, context](const at::Tensor& x) { return block->forward(x, context, nullptr); }, h,
          checkpointing);
    } else {
      h = block->forward(h, context, layer_cache);
    }
    if (i < inputs.layer_additions.size()) {
      const at::Tensor& marked = inputs.addition_mask;
      h = h.index_put({marked}, h.index({marked}) + inputs.layer_additions[i].to(h.scalar_type()));
    }
  }
  return norm->forward(h);
}

CausalLm::CausalLm(torch::nn::Module& owner, const LlamaConfig& config)
    : CausalLm(owner, "model", owner, config) {}

CausalLm::CausalLm(torch::nn::Module& decoder_owner, const std::string& decoder_name,
                   torch::nn::Module& head_owner, const LlamaConfig& config) {
  model = decoder_owner.register_module(decoder_name, LlamaDecoder(config));
  if (!config.tie_word_embeddings) {
    lm_head =
        head_owner.register_module("lm_head", Projection(config.hidden_size, config.vocab_size));
  }
}

void CausalLm::InitializeWeights() {
  const double range = model->config().initializer_range;
  transformer::InitializeWeights(*model, range);
  if (lm_head) transformer::InitializeWeights(*lm_head, range);
}

std::vector<std::string> CausalLm::BlockNames(torch::nn::Module& root) const {
  std::map<const torch::nn::Module*, std::string> name_of;
  for (const auto& item : root.named_modules()) name_of[item.value().get()] = item.key();
  std::vector<std::string> names;
  for (size_t i = 0; i < model->layers->size(); ++i) {
    auto it = name_of.find(model->layers->ptr(i).get());
    if (it != name_of.end()) names.push_back(it->second);
  }
  return names;
}

std::set<std::string> CausalLm::OptionalCheckpointTensors() const {
  if (lm_head) return {};
  return {"lm_head.weight"};
}

at::Tensor CausalLm::Logits(const at::Tensor& hidden) {
  if (lm_head) return lm_head->forward(hidden);
  return at::matmul(hidden, model->embed_tokens->weight.t());
}

at::Tensor CausalLm::DenseHeadWeight() const {
  if (!lm_head) return model->embed_tokens->weight;
  const bool adapters = !lm_head->adapters().empty() && !lm_head->merged();
  if (lm_head->quantized() != nullptr || adapters || lm_head->bias.defined()) return at::Tensor();
  return lm_head->weight;
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
