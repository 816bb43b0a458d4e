// Each precision policy's training step time relative to fp32, on the same model, in one run.
//
//   build/bin/precision_bench [--data data/digits.csv.gz] [--hidden 1024] [--repeats 3]
//                             [--policies fp32,bf16-mixed] [--trace FILE]
//
// The engine trains an MLP (two hidden layers of --hidden units, batch 32) on the digits images
// under each policy this device can run, and prints seconds per step (best of --repeats) and the
// ratio to fp32, with the step by phase below each row. Policies the device cannot run are listed
// with the reason. `auto` shows what it chose. --policies runs only those (the ratio needs fp32
// among them); --trace writes LibTorch's profile of every run to FILE (bench/trace_summary.py).

#include <torch/csrc/autograd/profiler_legacy.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/allocator.h"
#include "core/logging.h"
#include "core/remove_tree.h"
#include "precision/device_capability.h"

int main(int argc, char** argv) {
  FLAGS_minloglevel = google::GLOG_ERROR;
  engine::ConfigureAllocatorForTraining();
  std::string data = "data/digits.csv.gz";
  int hidden = 1024;
  int repeats = 3;
  std::string policies = "fp32,bf16-mixed,bf16-true,fp16-mixed,fp16-true,auto", trace;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--data") data = argv[i + 1];
    if (arg == "--hidden") hidden = std::atoi(argv[i + 1]);
    if (arg == "--repeats") repeats = std::atoi(argv[i + 1]);
    if (arg == "--policies") policies = argv[i + 1];
    if (arg == "--trace") trace = argv[i + 1];
  }
  std::unique_ptr<torch::autograd::profiler::RecordProfile> profile;
  if (!trace.empty()) profile = std::make_unique<torch::autograd::profiler::RecordProfile>(trace);
  data = std::filesystem::absolute(data).string();
  const auto dir = std::filesystem::temp_directory_path() / "engine-precision-bench";
  const engine::DeviceCapability device = engine::ProbeDevice("cpu");
  std::printf("device %s; LibTorch %s\n", device.Describe().c_str(), TORCH_VERSION);
  std::printf("mlp 64 -> %d -> %d -> 10, batch 32, 90 steps per run, best of %d\n", hidden, hidden,
              repeats);
  std::printf("%-12s %-12s %12s %10s %10s\n", "policy", "runs as", "ms/step", "vs fp32",
              "accuracy");
  const std::string layers =
      " hidden_units: " + std::to_string(hidden) + " hidden_units: " + std::to_string(hidden);
  double fp32 = 0;
  std::stringstream listed(policies);
  for (std::string policy; std::getline(listed, policy, ',');) {
    const bool fp16 = policy.rfind("fp16", 0) == 0;
    if (fp16 && !(device.fp16 && device.fp16_autocast)) {
      std::printf("%-12s %-12s %12s  (this device cannot compute in fp16)\n", policy.c_str(), "-",
                  "-");
      continue;
    }
    double best = 1e30, accuracy = 0, best_seconds = 0;
    int64_t steps = 0;
    engine::StepPhaseSeconds phases;  // of the best run
    std::string ran;
    for (int r = 0; r < repeats; ++r) {
      engine::StageResult result = engine::bench::RunStage(
          dir,
          engine::bench::DigitsMlpPipeline(
              dir / "out", data, layers,
              "  precision { plugin: \"" + policy + "\" }\n  schedule { max_steps: 90 }"),
          &ran);
      const double per_step = result.train_seconds / static_cast<double>(result.steps);
      if (per_step < best) {
        best_seconds = result.train_seconds;
        steps = result.steps;
        phases = result.step_phases;
      }
      best = std::min(best, per_step);
      accuracy = result.eval_metrics["eval/accuracy"];
    }
    if (policy == "fp32") fp32 = best;
    std::printf("%-12s %-12s %12.3f %10.2f %10.4f\n", policy.c_str(), ran.c_str(), best * 1e3,
                fp32 > 0 ? best / fp32 : 0.0, accuracy);
    engine::bench::PrintStepPhases(phases, best_seconds, steps);
  }
  profile.reset();  // writes the trace
  std::error_code removed;
  engine::RemoveTree(dir, removed);
  return 0;
}
