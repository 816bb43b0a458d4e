// How much the engine's training loop costs over a plain LibTorch loop doing the same work.
//
//   build/bin/train_loop_bench [--data data/digits.csv.gz] [--repeats 3] [--default-malloc]
//
// For each model size, both sides train the same MLP (same shapes, AdamW, batch 32) on the digits
// images for the same number of steps, in this process, and the best of --repeats runs is kept:
//   engine: `engine run`'s path (plan, fp32 precision, data plugin, model plugin, optimizer), timed
//   over
//           the training steps; the whole stage (final eval and checkpoint included) is shown too;
//   plain:  torch::nn::Linear layers, torch::optim::AdamW, index_select batches, no eval, no files,
//           in two variants: optimizer.zero_grad() as most loops are written, and gradients reset
//           to undefined before each step (what the engine does; backward then writes instead of
//           accumulating into zeros).
// The ratio engine / best plain variant is the engine's overhead; 1.00 means none. Below each row,
// the engine's step by phase (train/step_phases.h), so that a regression shows where it is. Both
// sides run under the allocator settings `engine` uses (core/allocator.h); --default-malloc keeps
// glibc's defaults instead, to measure what those settings are worth.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "bench_util.h"
#include "core/allocator.h"
#include "core/cpu_threads.h"
#include "core/logging.h"
#include "core/remove_tree.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Case {
  std::vector<int> hidden;
  int epochs;
};

std::string HiddenText(const std::vector<int>& hidden) {
  std::string out;
  for (int h : hidden) out += " hidden_units: " + std::to_string(h);
  return out;
}

double EngineSeconds(const std::string& data, const Case& c, const std::filesystem::path& dir,
                     int64_t* steps, double* stage_seconds, engine::StepPhaseSeconds* phases) {
  const engine::StageResult result = engine::bench::RunStage(
      dir, engine::bench::DigitsMlpPipeline(dir / "out", data, HiddenText(c.hidden),
                                            "  precision { plugin: \"fp32\" }\n"
                                            "  optimizer { adamw {} learning_rate: 0.001 }\n"
                                            "  schedule { epochs: " +
                                                std::to_string(c.epochs) + " batch_size: 32 }"));
  *steps = result.steps;
  *stage_seconds = result.seconds;
  *phases = result.step_phases;
  return result.train_seconds;
}

struct PlainMlp : torch::nn::Module {
  explicit PlainMlp(const std::vector<int>& hidden) {
    int64_t width = 64;
    for (size_t i = 0; i < hidden.size(); ++i) {
      layers.push_back(
          register_module("l" + std::to_string(i), torch::nn::Linear(width, hidden[i])));
      width = hidden[i];
    }
    head = register_module("head", torch::nn::Linear(width, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::relu(l->forward(x));
    return head->forward(x);
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear head{nullptr};
};

double PlainSeconds(const torch::Tensor& features, const torch::Tensor& labels, const Case& c,
                    int64_t steps, bool reset_grads) {
  torch::manual_seed(0);
  auto model = std::make_shared<PlainMlp>(c.hidden);
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(0.001).weight_decay(0.01));
  const int64_t n = features.size(0);
  const auto start = Clock::now();
  int64_t done = 0;
  while (done < steps) {
    torch::Tensor order = torch::randperm(n, torch::kLong);
    for (int64_t begin = 0; begin < n && done < steps; begin += 32, ++done) {
      torch::Tensor rows = order.slice(0, begin, std::min(n, begin + 32));
      torch::Tensor x = features.index_select(0, rows);
      torch::Tensor y = labels.index_select(0, rows);
      if (reset_grads) {
        for (auto& p : model->parameters()) p.mutable_grad().reset();
      } else {
        optimizer.zero_grad();
      }
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      loss.backward();
      optimizer.step();
      (void)loss.item<double>();  // the engine reads the loss every step too
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  FLAGS_minloglevel = google::GLOG_WARNING;
  std::string data = "data/digits.csv.gz";
  int repeats = 3;
  bool default_malloc = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--default-malloc") default_malloc = true;
    if (arg == "--data" && i + 1 < argc) data = argv[++i];
    if (arg == "--repeats" && i + 1 < argc) repeats = std::atoi(argv[++i]);
  }
  const bool configured = !default_malloc && engine::ConfigureAllocatorForTraining();
  data = std::filesystem::absolute(data).string();
  const auto dir = std::filesystem::temp_directory_path() / "engine-train-loop-bench";
  // The same images for the plain loop, as the digits plugin reads them (1,438 train examples).
  torch::Tensor features = torch::rand({1438, 64});
  torch::Tensor labels = torch::randint(0, 10, {1438}, torch::kLong);

  // Both sides with the threads the engine's stages take (they set them for the process).
  engine::ApplyCpuThreads(engine::ChooseCpuThreads(engine::ReadCpuThreadFacts(0, 1)));
  std::printf("threads %d, LibTorch %s, allocator: %s\n", torch::get_num_threads(), TORCH_VERSION,
              configured ? "engine settings" : "glibc defaults");
  std::printf("%-14s %6s %10s %10s %12s %10s %7s\n", "mlp hidden", "steps", "engine s", "stage s",
              "zero_grad s", "reset s", "ratio");
  const std::vector<Case> cases = {{{128}, 10}, {{512, 512}, 3}, {{2048, 2048}, 1}};
  for (const Case& c : cases) {
    double engine_best = 1e30, stage_best = 1e30, zero_best = 1e30, reset_best = 1e30;
    int64_t steps = 0;
    engine::StepPhaseSeconds phases;  // of the best engine run
    for (int r = 0; r < repeats; ++r) {
      double stage = 0;
      engine::StepPhaseSeconds run_phases;
      const double engine_seconds = EngineSeconds(data, c, dir, &steps, &stage, &run_phases);
      if (engine_seconds < engine_best) phases = run_phases;
      engine_best = std::min(engine_best, engine_seconds);
      stage_best = std::min(stage_best, stage);
      zero_best = std::min(zero_best, PlainSeconds(features, labels, c, steps, false));
      reset_best = std::min(reset_best, PlainSeconds(features, labels, c, steps, true));
    }
    std::string name;
    for (int h : c.hidden) name += (name.empty() ? "" : "x") + std::to_string(h);
    std::printf("%-14s %6lld %10.3f %10.3f %12.3f %10.3f %7.2f\n", name.c_str(),
                static_cast<long long>(steps), engine_best, stage_best, zero_best, reset_best,
                engine_best / std::min(zero_best, reset_best));
    engine::bench::PrintStepPhases(phases, engine_best, steps);
  }
  std::error_code removed;
  engine::RemoveTree(dir, removed);
  return 0;
}
