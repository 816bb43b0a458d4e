// The decoders' CPU kernels (plugins/transformer/kernel_ops.h) against the ATen expressions they
// replace, forward and backward through autograd, in one process:
//
//   build/bin/decoder_kernels_bench [--batch 32] [--seq 128] [--hidden 128] [--heads 4]
//                                   [--kv_heads 2] [--intermediate 352] [--dtype f32|bf16]
//                                   [--repeats 5]
//
//   attention: rotary + causal attention on one fused q/k/v projection (the decoder's path)
//              against ApplyRotary, repeated key/value heads, scores, masked f32 softmax and the
//              value product (the math path), then ("vs sdpa") against ApplyRotary and
//              LibTorch's scaled_dot_product_attention (causal, grouped heads read in place:
//              what ENGINE_ATTENTION=sdpa runs);
//   swiglu:    silu(gate) * up on one fused gate/up projection against at::silu and a product;
//   rms_norm:  Llama's RMSNorm against its six ATen ops.
// Each row: ms for forward + backward (best of --repeats), ATen / kernel (above 1: the kernel is
// faster), and for the element-wise two the kernel's bytes moved per second against memcpy's.
// Default sizes are bench/lm_vs_pytorch.py's model; one intra-op thread unless LibTorch has more.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "best_time.h"
#include "core/allocator.h"
#include "kernel_ops.h"
#include "llama_config.h"
#include "rotary.h"

namespace {

using engine::bench::BestSeconds;
namespace tf = engine::transformer;

struct Sizes {
  int64_t batch = 32, seq = 128, hidden = 128, heads = 4, kv_heads = 2, intermediate = 352;
  at::ScalarType dtype = at::kFloat;
  int repeats = 5;
};

// Forward and backward of `forward` on fresh leaves copied from `inputs`.
template <typename Forward>
double TimeStep(const Sizes& s, const std::vector<at::Tensor>& inputs, Forward forward) {
  return BestSeconds(s.repeats, [&] {
    std::vector<at::Tensor> leaves;
    for (const at::Tensor& x : inputs) leaves.push_back(x.detach().requires_grad_());
    const at::Tensor out = forward(leaves);
    out.backward(at::ones_like(out));
  });
}

void PrintRow(const char* name, double kernel, double aten, double bytes, double memcpy_bps) {
  std::printf("%-10s %10.3f %10.3f %7.2f", name, kernel * 1e3, aten * 1e3, aten / kernel);
  if (bytes > 0) {
    std::printf("   %6.1f GB/s (%.2f of memcpy)", bytes / kernel / 1e9,
                bytes / kernel / memcpy_bps);
  }
  std::printf("\n");
}

}  // namespace

// Long by design: the benchmark reads as its report, one measured figure after another.
int main(int argc, char** argv) {
  engine::ConfigureAllocatorForTraining();
  Sizes s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--batch") s.batch = std::stoll(value);
    if (arg == "--seq") s.seq = std::stoll(value);
    if (arg == "--hidden") s.hidden = std::stoll(value);
    if (arg == "--heads") s.heads = std::stoll(value);
    if (arg == "--kv_heads") s.kv_heads = std::stoll(value);
    if (arg == "--intermediate") s.intermediate = std::stoll(value);
    if (arg == "--repeats") s.repeats = std::stoi(value);
    if (arg == "--dtype") s.dtype = value == "bf16" ? at::kBFloat16 : at::kFloat;
  }
  const int64_t d = s.hidden / s.heads, tokens = s.batch * s.seq;
  const int64_t element = s.dtype == at::kFloat ? 4 : 2;
  std::printf(
      "%lld x %lld tokens, hidden %lld, %lld/%lld heads of %lld, intermediate %lld, %s, "
      "%d threads\n",
      static_cast<long long>(s.batch), static_cast<long long>(s.seq),
      static_cast<long long>(s.hidden), static_cast<long long>(s.heads),
      static_cast<long long>(s.kv_heads), static_cast<long long>(d),
      static_cast<long long>(s.intermediate), s.dtype == at::kFloat ? "f32" : "bf16",
      at::get_num_threads());

  // memcpy of the SwiGLU forward's output size, for the bandwidth column.
  const size_t copy_bytes = static_cast<size_t>(tokens * s.intermediate * 4);
  std::vector<char> src(copy_bytes, 1), dst(copy_bytes);
  const double copy =
      BestSeconds(s.repeats, [&] { std::memcpy(dst.data(), src.data(), copy_bytes); });
  const double memcpy_bps = 2.0 * static_cast<double>(copy_bytes) / copy;  // read + write
  std::printf("memcpy %.1f GB/s (read + write)\n\n", memcpy_bps / 1e9);
  std::printf("%-10s %10s %10s %7s\n", "op", "kernel ms", "ATen ms", "ratio");

  at::manual_seed(0);
  tf::LlamaConfig config;
  config.hidden_size = s.hidden;
  config.num_attention_heads = s.heads;
  config.num_key_value_heads = s.kv_heads;
  const tf::RotaryTables rotary =
      tf::BuildRotaryTables(config, at::arange(s.seq, at::kLong).unsqueeze(0), at::kFloat);
  {
    const at::Tensor qkv = at::randn({s.batch, s.seq, (s.heads + 2 * s.kv_heads) * d}).to(s.dtype);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const double kernel = TimeStep(s, {qkv}, [&](const std::vector<at::Tensor>& x) {
      return tf::KernelPackedCausalAttention(x[0], s.heads, s.kv_heads, scale, 0, &rotary);
    });
    const at::Tensor mask = at::ones({s.seq, s.seq}, at::kBool).triu(1);
    // The packed projection's q, k and v heads [batch, heads, seq, d], q and k rotated.
    const auto rotated_heads = [&](const at::Tensor& packed) {
      const auto part = [&](int64_t first, int64_t count) {
        return packed.narrow(2, first * d, count * d)
            .view({s.batch, s.seq, count, d})
            .transpose(1, 2);
      };
      return std::array<at::Tensor, 3>{tf::ApplyRotary(part(0, s.heads), rotary),
                                       tf::ApplyRotary(part(s.heads, s.kv_heads), rotary),
                                       part(s.heads + s.kv_heads, s.kv_heads)};
    };
    const double aten = TimeStep(s, {qkv}, [&](const std::vector<at::Tensor>& x) {
      const auto [q, k_grouped, v_grouped] = rotated_heads(x[0]);
      const int64_t groups = s.heads / s.kv_heads;
      const at::Tensor k = k_grouped.repeat_interleave(groups, 1);
      const at::Tensor v = v_grouped.repeat_interleave(groups, 1);
      const at::Tensor scores = (at::matmul(q, k.transpose(2, 3)) * scale)
                                    .masked_fill(mask, std::numeric_limits<float>::lowest());
      return at::matmul(at::softmax(scores, -1, at::kFloat).to(v.scalar_type()), v);
    });
    PrintRow("attention", kernel, aten, 0, memcpy_bps);
    // LibTorch's fused attention on the same rotated heads (its flash kernel on the CPU, the
    // grouped key/value heads read in place): the path ENGINE_ATTENTION=sdpa takes.
    const double sdpa = TimeStep(s, {qkv}, [&](const std::vector<at::Tensor>& x) {
      const auto [q, k, v] = rotated_heads(x[0]);
      return at::scaled_dot_product_attention(q.to(v.scalar_type()), k.to(v.scalar_type()), v,
                                              /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                              /*is_causal=*/true, scale, /*enable_gqa=*/true);
    });
    PrintRow("vs sdpa", kernel, sdpa, 0, memcpy_bps);
  }
  {
    const at::Tensor gate_up = at::randn({s.batch, s.seq, 2 * s.intermediate}).to(s.dtype);
    const double kernel = TimeStep(s, {gate_up}, [&](const std::vector<at::Tensor>& x) {
      return tf::KernelPackedSwiGlu(x[0]);
    });
    const double aten = TimeStep(s, {gate_up}, [&](const std::vector<at::Tensor>& x) {
      return at::silu(x[0].narrow(-1, 0, s.intermediate)) *
             x[0].narrow(-1, s.intermediate, s.intermediate);
    });
    // Forward: read gate and up, write the product; backward: read the gradient, gate and up,
    // write both gradients.
    const double bytes = static_cast<double>(tokens * s.intermediate * element) * 8;
    PrintRow("swiglu", kernel, aten, bytes, memcpy_bps);
  }
  {
    const at::Tensor x = at::randn({s.batch, s.seq, s.hidden}).to(s.dtype);
    const at::Tensor weight = at::rand({s.hidden}) + 0.5;
    const double kernel = TimeStep(s, {x, weight}, [&](const std::vector<at::Tensor>& in) {
      return tf::KernelRmsNorm(in[0], in[1], 1e-6);
    });
    const double aten = TimeStep(s, {x, weight}, [&](const std::vector<at::Tensor>& in) {
      const at::Tensor f = in[0].to(at::kFloat);
      return in[1] * (f * at::rsqrt(f.pow(2).mean(-1, true) + 1e-6)).to(in[0].scalar_type());
    });
    // Forward: read x, write y (f32); backward: read the gradient and x, write dx.
    const double bytes = static_cast<double>(tokens * s.hidden) * (3.0 * element + 2.0 * 4);
    PrintRow("rms_norm", kernel, aten, bytes, memcpy_bps);
  }
  return 0;
}
