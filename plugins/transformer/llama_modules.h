// The modules of a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3 as LlamaConfig describes
// them), named as Hugging Face names them, and greedy generation with a key/value cache.
//
//   LlamaDecoder model(config);            // embed_tokens, layers.N.{...}, norm
//   at::Tensor hidden = model->forward(model->Embed(ids), /*offset=*/0, /*cache=*/nullptr);
//   DecoderInputs padded{0, attention_mask};  // a batch of unequal lengths
//   hidden = model->Forward(model->Embed(ids), padded, nullptr);
//
// Attention is causal (within a sliding window on the layers that slide), never attends to padding,
// and uses rotary embeddings and grouped-query heads; softmax runs in f32 whatever the compute
// dtype. The rotary tables and masks are built once per forward for all layers. Each decoder layer
// runs through engine::RunBlock (engine/model_block.h): checkpointed when asked, or gathered from
// the ranks of a stage that splits the parameters.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <set>
#include <string>
#include <vector>

#include "engine/linear.h"
#include "llama_config.h"
#include "rotary.h"

namespace engine::transformer {

// Keys and values seen so far, per layer: [batch, kv_heads, positions, head_dim].
struct LayerCache {
  at::Tensor key;
  at::Tensor value;
};
using KvCache = std::vector<LayerCache>;

// `activation` applied elementwise, as transformers' ACT2FN computes it.
at::Tensor Activate(const at::Tensor& x, Activation activation);

class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t size, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

// What one forward attends to, beyond the embeddings.
struct DecoderInputs {
  // Index of the first new position (the cache's length).
  int64_t offset = 0;
  // i64 or bool [batch, offset + positions], 1 for real tokens and 0 for padding; undefined: none.
  at::Tensor attention_mask;
  // i64 [batch, positions], or [3, batch, positions] with mrope_section (Qwen2-VL's temporal,
  // height and width positions); undefined: from attention_mask (attention_mask.h PositionIds).
  at::Tensor position_ids;
  // Added to the hidden states after layer i at the positions `addition_mask` (bool [batch,
  // positions]) marks, [marked positions, hidden] each (Qwen3-VL's DeepStack: vision features at
  // the image tokens); at most one per layer.
  std::vector<at::Tensor> layer_additions;
  at::Tensor addition_mask;
};

// What every layer's attention reads in one forward, built once by the decoder.
struct AttentionContext {
  RotaryTables rotary;
  at::Tensor full_mask;     // true = not attended; undefined = nothing masked
  at::Tensor sliding_mask;  // the same within the window, for the layers that slide
  // The full mask is the plain causal one (no padding, no cache) and so is the sliding one (the
  // window reaches back to the first position): fused attention then masks by itself.
  bool full_is_causal = false;
  bool sliding_is_causal = false;
  // FusedAttention(), asked once per forward rather than in every layer.
  bool fused = false;
  // The masks as biases added to the scores (0, or the dtype's lowest), made once per dtype by the
  // first layer that needs them.
  mutable at::Tensor full_bias, sliding_bias;
  // Padded or packed rows without a cache on the CPU: the masks as one key range per query
  // (KeyRanges) for the attention kernel; undefined otherwise, or where a range cannot say it.
  at::Tensor full_ranges, sliding_ranges;
};

// Whether attention runs through LibTorch's fused scaled_dot_product_attention (LibTorch 2.1 and
// later, unless ENGINE_ATTENTION=math) or the math path (matmul, masked softmax in f32, matmul).
bool FusedAttention();

// The context of `inputs` for `positions` new positions, in the queries' `dtype`.
AttentionContext BuildAttentionContext(const LlamaConfig& config, const DecoderInputs& inputs,
                                       int64_t positions, at::ScalarType dtype,
                                       const at::Device& device);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaConfig& config, bool slides = false);
  // x: [batch, positions, hidden]. With a cache, the new keys and values are appended to it and
  // attention covers all cached positions.
  at::Tensor forward(const at::Tensor& x, const AttentionContext& context, LayerCache* cache);
  // The same for unpadded positions from `offset` on.
  at::Tensor forward(const at::Tensor& x, int64_t offset, LayerCache* cache);

  engine::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  std::shared_ptr<RmsNormImpl> q_norm, k_norm;  // Qwen3 only (null otherwise)

 private:
  // Keys within this many positions on a sliding layer; 0 elsewhere.
  int64_t Window() const;
  // The causal, uncached forward through the engine's kernels (kernel_ops.h).
  at::Tensor KernelForward(const at::Tensor& x, const AttentionContext& context);

  LlamaConfig config_;
  bool slides_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMlpImpl : public torch::nn::Module {
 public:
  explicit LlamaMlpImpl(const LlamaConfig& config);
  // gate_proj, up_proj [hidden -> intermediate] and down_proj, with biases or not (a vision
  // tower's gated MLP).
  LlamaMlpImpl(int64_t hidden, int64_t intermediate, bool bias, Activation activation);
  at::Tensor forward(const at::Tensor& x);

  engine::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  Activation activation_;
};
TORCH_MODULE(LlamaMlp);

class LlamaBlockImpl : public torch::nn::Module {
 public:
  LlamaBlockImpl(const LlamaConfig& config, int64_t layer);
  at::Tensor forward(const at::Tensor& x, const AttentionContext& context, LayerCache* cache);

  RmsNorm input_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  RmsNorm post_attention_layernorm{nullptr};
  LlamaMlp mlp{nullptr};
};
TORCH_MODULE(LlamaBlock);

class LlamaDecoderImpl : public torch::nn::Module {
 public:
  explicit LlamaDecoderImpl(const LlamaConfig& config);

  at::Tensor Embed(const at::Tensor& ids);
  // embeds: [batch, positions, hidden] -> the final hidden states (after `norm`). A cache must
  // hold num_hidden_layers entries (empty to start). Checkpointing applies only without a cache.
  at::Tensor forward(const at::Tensor& embeds, int64_t offset, KvCache* cache,
                     bool checkpointing = false);
  // The same for a padded batch (or given positions).
  at::Tensor Forward(const at::Tensor& embeds, const DecoderInputs& inputs, KvCache* cache,
                     bool checkpointing = false);

  const LlamaConfig& config() const { return config_; }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RmsNorm norm{nullptr};

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaDecoder);

// A decoder and its output projection, registered on `owner` as "model" and (unless tied)
// "lm_head", so the names are Hugging Face's wherever the parts live.
struct CausalLm {
  CausalLm(torch::nn::Module& owner, const LlamaConfig& config);
  // The decoder registered on `decoder_owner` as `decoder_name` (Qwen3-VL's
  // "model.language_model"), the head on `head_owner` as "lm_head".
  CausalLm(torch::nn::Module& decoder_owner, const std::string& decoder_name,
           torch::nn::Module& head_owner, const LlamaConfig& config);

  at::Tensor Logits(const at::Tensor& hidden);
  // The head as one dense weight [vocab, hidden] (the embeddings when tied) when Logits is just
  // hidden @ weight^T; undefined when the head is quantized, has unmerged adapters or a bias.
  at::Tensor DenseHeadWeight() const;
  // Greedy decoding after `prefix` ([batch, positions, hidden] embeddings): up to max_new_tokens
  // ids per row, [batch, generated]. Rows stop at `eos_id` (the rest of a stopped row repeats it).
  // With use_cache the prefix runs once and each new token attends to the cache; without, the whole
  // sequence runs again for every token (for checking the cache).
  at::Tensor Generate(const at::Tensor& prefix, int64_t max_new_tokens, int64_t eos_id,
                      bool use_cache);
  // Hugging Face's initialisation (InitializeWeights) of the decoder and head.
  void InitializeWeights();
  // The tensors a checkpoint of this model may lack: lm_head.weight when it is tied.
  std::set<std::string> OptionalCheckpointTensors() const;
  // The decoder layers' full names in `root` (the module that holds this CausalLm): the blocks the
  // decoder runs through RunBlock (engine/model_block.h), for Model::blocks().
  std::vector<std::string> BlockNames(torch::nn::Module& root) const;

  LlamaDecoder model{nullptr};
  engine::Linear lm_head{nullptr};
};

// Hugging Face's initialisation: normal(0, initializer_range) for projections and embeddings, ones
// for norms. Uses LibTorch's generator (seeded by the engine).
void InitializeWeights(torch::nn::Module& module, double initializer_range);

}  // namespace engine::transformer
