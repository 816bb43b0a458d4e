// Peak memory and time of the next-token loss through the chunked head cross-entropy
// (plugins/transformer/lm_head_loss.h) against matmul + cross_entropy over the whole logits, with
// a real vocabulary, forward and backward, each in a child process of its own (peak resident
// memory is per process):
//
//   build/bin/lm_head_loss_bench [--tokens 1024] [--hidden 1536] [--vocab 151936] [--bf16 1]
//                                [--frozen-head 1]
//
// Defaults: Qwen2-VL-2B's head (hidden 1536, vocabulary 151,936) on 1024 tokens, f32. --bf16 1
// runs both under bf16 autocast (bf16-mixed); --frozen-head 1 leaves the head weight without a
// gradient, as LoRA and QLoRA stages do (only the hidden states' gradient). Prints each
// side's peak RSS above the inputs and gradients both need (hidden states, head weight and their
// gradients), its seconds, and the ratios.
#include <ATen/ATen.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/csrc/autograd/autograd.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "engine/precision_context.h"
#include "lm_head_loss.h"

namespace {

struct Sizes {
  int64_t tokens = 1024, hidden = 1536, vocab = 151936;
  bool bf16 = false, frozen_head = false;
};

long PeakKb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// One side, in this process: prints "<peak kB above the baseline> <seconds>".
int RunSide(const Sizes& s, bool chunked) {
  engine::ConfigureAllocatorForTraining();
  at::manual_seed(0);
  at::Tensor hidden = at::randn({s.tokens, s.hidden}).requires_grad_();
  // Scaled in place: a temporary of the weight's size would raise the high-water mark that the
  // baseline below reads, hiding a side's own peak.
  at::Tensor weight = at::randn({s.vocab, s.hidden}).mul_(0.02).requires_grad_(!s.frozen_head);
  const at::Tensor targets = at::randint(0, s.vocab, {s.tokens}, at::kLong);
  // What both sides hold anyway: the inputs and their gradients.
  const at::Tensor held = at::zeros_like(hidden);
  const at::Tensor held_weight = s.frozen_head ? at::Tensor() : at::zeros_like(weight);
  const engine::PrecisionContext precision =
      s.bf16 ? engine::PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16)
             : engine::PrecisionContext::None();
  const long baseline = PeakKb();
  const auto start = std::chrono::steady_clock::now();
  at::Tensor loss;
  {
    auto scope = precision.Enter();
    loss = chunked
               ? engine::transformer::ChunkedHeadCrossEntropy(hidden, weight, targets, -100, false)
                     .loss
               : at::cross_entropy_loss(at::matmul(hidden, weight.t()), targets);
  }
  std::vector<at::Tensor> inputs = {hidden};
  if (!s.frozen_head) inputs.push_back(weight);
  const auto grads = torch::autograd::grad({loss}, inputs);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t gradient_elements = 0;
  for (const at::Tensor& g : grads) gradient_elements += g.numel();
  std::printf("%ld %.3f %.6f\n", PeakKb() - baseline - gradient_elements * 4 / 1024, seconds,
              loss.item<double>());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Sizes s;
  std::string side;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--tokens") s.tokens = std::stoll(value);
    if (arg == "--hidden") s.hidden = std::stoll(value);
    if (arg == "--vocab") s.vocab = std::stoll(value);
    if (arg == "--side") side = value;
    if (arg == "--bf16") s.bf16 = value == "1";
    if (arg == "--frozen-head") s.frozen_head = value == "1";
  }
  if (!side.empty()) return RunSide(s, side == "chunked");
  std::printf("%lld tokens, hidden %lld, vocabulary %lld, %s, head %s; whole logits: %.0f MB\n",
              static_cast<long long>(s.tokens), static_cast<long long>(s.hidden),
              static_cast<long long>(s.vocab), s.bf16 ? "bf16 autocast" : "f32",
              s.frozen_head ? "frozen" : "trained", s.tokens * s.vocab * 4 / 1e6);
  // This program's own path (popen's shell would read /proc/self/exe as itself).
  char path[4096] = {0};
  if (readlink("/proc/self/exe", path, sizeof(path) - 1) <= 0) return 1;
  const std::string self = path;
  double peak[2] = {0, 0}, seconds[2] = {0, 0}, loss[2] = {0, 0};
  for (int chunked = 0; chunked < 2; ++chunked) {
    const std::string command = self + " --tokens " + std::to_string(s.tokens) + " --hidden " +
                                std::to_string(s.hidden) + " --vocab " + std::to_string(s.vocab) +
                                " --bf16 " + (s.bf16 ? "1" : "0") + " --frozen-head " +
                                (s.frozen_head ? "1" : "0") + " --side " +
                                (chunked ? "chunked" : "whole");
    FILE* child = popen(command.c_str(), "r");
    if (child == nullptr ||
        std::fscanf(child, "%lf %lf %lf", &peak[chunked], &seconds[chunked], &loss[chunked]) != 3) {
      std::fprintf(stderr, "the %s side failed\n", chunked ? "chunked" : "whole");
      return 1;
    }
    pclose(child);
  }
  std::printf("%-8s %14s %9s %10s\n", "side", "peak extra MB", "seconds", "loss");
  std::printf("%-8s %14.0f %9.2f %10.6f\n", "whole", peak[0] / 1024, seconds[0], loss[0]);
  std::printf("%-8s %14.0f %9.2f %10.6f\n", "chunked", peak[1] / 1024, seconds[1], loss[1]);
  std::printf("chunked / whole: memory %.3f, time %.2f\n", peak[1] / peak[0],
              seconds[1] / seconds[0]);
  return 0;
}
