// Loading a pretrained checkpoint: peak resident memory and time of `engine run` (one step, which
// builds the stage's model: reads the weights, quantizes, adds adapters) and of `engine check`
// (which plans it, reading only what its quantizer takes) on a synthetic bf16 Llama checkpoint the
// bench writes itself, against the checkpoint's own size.
//
//   load_bench [LAYERS]   (default 22: TinyLlama-1.1B's shape, a 2.2 GB checkpoint)
//
// Two stages: the bf16 model (its final norm training; goal: peak <= 1.2x the checkpoint) and a
// QLoRA stage, nf4 on every model.layers.* linear with LoRA adapters (goal: <= 0.6x). The engine
// process's own floor (`engine check` of a tiny pipeline: LibTorch and the plugins) is printed
// beside them. `engine check` of each, then of the QLoRA stage on the same shape with random
// weights (sizes in the options) against the f32 model a run would build: the check draws only the
// 4-bit layers (goal: <= 0.35x).
#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/remove_tree.h"
#include "synthetic_llama.h"

namespace {

namespace fs = std::filesystem;
using bench::Shape;
using bench::WriteSyntheticLlama;

std::string Pipeline(const std::string& model, const std::string& layers) {
  return "name: \"load\"\nstage {\n  name: \"s\"\n  model { plugin: \"llama\" options { "
         "[type.googleapis.com/engine.transformer.LlamaOptions] { " +
         model + " } } }\n" + layers +
         "  data { plugin: \"text\" options { [type.googleapis.com/engine.plugins.TextOptions] { "
         "path: \"docs.txt\" sequence_length: 8 eval_fraction: 0.34 } } }\n"
         "  optimizer { learning_rate: 0.001 }\n  schedule { max_steps: 1 batch_size: 1 }\n}\n";
}

struct Measured {
  double peak_bytes = 0;
  double seconds = 0;
};

// `engine COMMAND PIPELINE` in a child: its peak resident memory and wall time. A run trains the
// stage again (--force), so that every run loads the checkpoint.
Measured Measure(const fs::path& engine, const char* command, const fs::path& pipeline) {
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, STDOUT_FILENO);
    const bool run = std::string(command) == "run";
    ::execl(engine.c_str(), engine.c_str(), command, pipeline.c_str(), run ? "--force=s" : nullptr,
            nullptr);
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "engine %s %s failed (status %d)\n", command, pipeline.c_str(), status);
    std::exit(1);
  }
  return {static_cast<double>(usage.ru_maxrss) * 1024,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

}  // namespace

int main(int argc, char** argv) {
  Shape shape;
  if (argc > 1) shape.layers = std::strtol(argv[1], nullptr, 10);
  const fs::path engine = fs::canonical("/proc/self/exe").parent_path() / "engine";
  const fs::path dir = fs::temp_directory_path() / ("load_bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "docs.txt") << "one document here\n\nanother document here\n\n"
                                     "a third one here\n";
  const double bytes = static_cast<double>(WriteSyntheticLlama(dir / "model", shape));
  std::ofstream(dir / "tiny.pbtxt") << Pipeline(
      "hidden_size: 16 num_hidden_layers: 1 "
      "num_attention_heads: 2",
      "");
  const std::string nf4_lora =
      "  quantizer { plugin: \"nf4\" options { [type.googleapis.com/engine.plugins.Nf4Options] { "
      "target_modules: \"model.layers.*\" } } }\n"
      "  adapter { plugin: \"lora\" options { [type.googleapis.com/engine.plugins.LoraOptions] { "
      "r: 16 lora_alpha: 32 target_modules: \"model.layers.*\" } } }\n";
  // Only the final norm trains, so that the run's peak is the model's, not AdamW's.
  std::ofstream(dir / "full.pbtxt")
      << Pipeline("pretrained: \"model\"", "  trainable { include: \"model.norm.*\" }\n");
  std::ofstream(dir / "qlora.pbtxt") << Pipeline("pretrained: \"model\"", nf4_lora);
  std::ofstream(dir / "qlora_random.pbtxt")
      << Pipeline("hidden_size: " + std::to_string(shape.hidden) +
                      " intermediate_size: " + std::to_string(shape.intermediate) +
                      " num_hidden_layers: " + std::to_string(shape.layers) +
                      " num_attention_heads: " + std::to_string(shape.heads) +
                      " num_key_value_heads: " + std::to_string(shape.kv_heads) +
                      " vocab_size: " + std::to_string(shape.vocab),
                  nf4_lora);
  Measure(engine, "run", dir / "full.pbtxt");  // the checkpoint into the page cache
  const Measured floor = Measure(engine, "check", dir / "tiny.pbtxt");
  const Measured full = Measure(engine, "run", dir / "full.pbtxt");
  const Measured qlora = Measure(engine, "run", dir / "qlora.pbtxt");
  const Measured full_check = Measure(engine, "check", dir / "full.pbtxt");
  const Measured qlora_check = Measure(engine, "check", dir / "qlora.pbtxt");
  const Measured random_check = Measure(engine, "check", dir / "qlora_random.pbtxt");
  std::error_code removed;
  engine::RemoveTree(dir, removed);  // not fs::remove_all: see core/remove_tree.h
  const double gb = 1e9;
  std::printf("checkpoint: %lld layers, %.2f GB bf16 (from the page cache)\n",
              static_cast<long long>(shape.layers), bytes / gb);
  std::printf("  engine floor (tiny model)       peak %5.2f GB  %5.1f s\n", floor.peak_bytes / gb,
              floor.seconds);
  auto row = [&](const char* what, const Measured& m, double of, const char* against,
                 const char* goal) {
    std::printf("  %-31s peak %5.2f GB  %5.1f s  %.2fx %s%s\n", what, m.peak_bytes / gb, m.seconds,
                m.peak_bytes / of, against, goal);
  };
  row("run, bf16 (its norm trains)", full, bytes, "the checkpoint", " (goal <= 1.2)");
  row("run, QLoRA (nf4 + lora)", qlora, bytes, "the checkpoint", " (goal <= 0.6)");
  row("check, bf16", full_check, bytes, "the checkpoint", " (reads the headers)");
  row("check, QLoRA", qlora_check, bytes, "the checkpoint", " (draws the 4-bit layers)");
  // The checkpoint is bf16: the same model in f32 is twice its bytes.
  row("check, QLoRA with random weights", random_check, 2 * bytes, "the f32 model",
      " (goal <= 0.35)");
  return 0;
}
