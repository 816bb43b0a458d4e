// The engine's side of bench/lm_vs_pytorch.py: trains the small Llama of
// pipelines/lm_fortunes.pbtxt for a fixed number of steps through `engine run`'s path and prints
// one JSON line with its training tokens/s. Run it through the Python script, which times PyTorch
// eager on the same model and step and prints the ratio; alone it is only half a measurement.
//
//   build/bin/lm_step_bench --precision fp32|bf16-mixed [--steps 60] [--batch 32] [--seq 128]
//                           [--hidden 128] [--layers 2] [--data data/fortunes.txt]
//                           [--trace FILE]
//
// --trace writes LibTorch's profile of the whole run (chrome://tracing JSON; each op's time, the
// step's parts included) to FILE; bench/trace_summary.py sums it per op.
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <cstdio>
#include <memory>
#include <string>

#include "bench_util.h"
#include "core/allocator.h"
#include "core/logging.h"
#include "core/remove_tree.h"

namespace {

std::string LmPipeline(const std::filesystem::path& out, const std::string& data,
                       const std::string& precision, int steps, int batch, int seq, int hidden,
                       int layers) {
  return "output_dir: \"" + out.string() +
         "\"\nseed: 11\nstage { name: \"bench\"\n"
         "  model { plugin: \"llama\" options { [type.googleapis.com/engine.transformer."
         "LlamaOptions] { hidden_size: " +
         std::to_string(hidden) + " num_hidden_layers: " + std::to_string(layers) +
         " num_attention_heads: 4 num_key_value_heads: 2 tie_word_embeddings: true } } }\n"
         "  data { plugin: \"text\" options { [type.googleapis.com/engine.plugins.TextOptions] "
         "{ path: \"" +
         data + "\" document_separator: \"%\" sequence_length: " + std::to_string(seq) +
         " eval_fraction: 0.01 } } }\n"
         "  precision { plugin: \"" +
         precision +
         "\" }\n"
         "  optimizer { adamw { weight_decay: 0.01 } learning_rate: 0.003 max_grad_norm: 1.0 }\n"
         "  schedule { max_steps: " +
         std::to_string(steps) + " batch_size: " + std::to_string(batch) +
         " }\n"
         "  checkpoint { save_optimizer_state: false }\n}\n";
}

}  // namespace

int main(int argc, char** argv) {
  FLAGS_minloglevel = google::GLOG_ERROR;
  engine::ConfigureAllocatorForTraining();
  std::string data = "data/fortunes.txt", precision = "fp32", trace;
  int steps = 60, batch = 32, seq = 128, hidden = 128, layers = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--data") data = value;
    if (arg == "--precision") precision = value;
    if (arg == "--steps") steps = std::stoi(value);
    if (arg == "--batch") batch = std::stoi(value);
    if (arg == "--seq") seq = std::stoi(value);
    if (arg == "--hidden") hidden = std::stoi(value);
    if (arg == "--layers") layers = std::stoi(value);
    if (arg == "--trace") trace = value;
  }
  data = std::filesystem::absolute(data).string();
  const auto dir = std::filesystem::temp_directory_path() / "engine-lm-step-bench";
  std::unique_ptr<torch::autograd::profiler::RecordProfile> profile;
  if (!trace.empty()) profile = std::make_unique<torch::autograd::profiler::RecordProfile>(trace);
  const engine::StageResult result = engine::bench::RunStage(
      dir, LmPipeline(dir / "out", data, precision, steps, batch, seq, hidden, layers));
  profile.reset();  // writes the trace
  std::error_code removed;
  engine::RemoveTree(dir, removed);
  const double tokens = static_cast<double>(result.steps) * batch * seq;
  std::printf(
      "{\"precision\": \"%s\", \"steps\": %lld, \"train_seconds\": %.4f, \"tokens_per_s\": %.1f, "
      "\"final_train_loss\": %.4f, \"threads\": %d}\n",
      precision.c_str(), static_cast<long long>(result.steps), result.train_seconds,
      tokens / result.train_seconds, result.final_train_loss, at::get_num_threads());
  return 0;
}
