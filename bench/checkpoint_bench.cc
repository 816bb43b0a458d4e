// Checkpoint bytes and save time of a QLoRA stage (nf4 on every model.layers.* linear, LoRA r 8 on
// q_proj and v_proj: PEFT's default for Llama) on a synthetic Llama checkpoint the bench writes
// itself: slim checkpoints (the trained tensors and optimizer state, the 4-bit base named by the
// model directory's content hashes) against self-contained ones (`checkpoint { self_contained: true
// }`: the base too), in the same run. Goal: slim <= 2% of self-contained in bytes, save time in
// proportion.
//
//   checkpoint_bench [LAYERS]   (default 22: TinyLlama-1.1B's shape, a 2.2 GB checkpoint)
//
// Each variant is one `engine run --verbose` of one step; the save time is the one the engine logs
// for the final checkpoint ("checkpoint ... written in S s").
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "core/remove_tree.h"
#include "synthetic_llama.h"

namespace {

namespace fs = std::filesystem;

std::string Pipeline(const std::string& checkpoint) {
  return "name: \"ckpt\"\nstage {\n  name: \"s\"\n  model { plugin: \"llama\" options { "
         "[type.googleapis.com/engine.transformer.LlamaOptions] { pretrained: \"model\" } } }\n"
         "  quantizer { plugin: \"nf4\" options { [type.googleapis.com/engine.plugins.Nf4Options] "
         "{ target_modules: \"model.layers.*\" } } }\n"
         "  adapter { plugin: \"lora\" options { [type.googleapis.com/engine.plugins.LoraOptions] "
         "{ r: 8 lora_alpha: 16 target_modules: \"model.layers.*.self_attn.q_proj\" "
         "target_modules: \"model.layers.*.self_attn.v_proj\" } } }\n"
         "  data { plugin: \"text\" options { [type.googleapis.com/engine.plugins.TextOptions] { "
         "path: \"docs.txt\" sequence_length: 8 eval_fraction: 0.34 } } }\n"
         "  optimizer { learning_rate: 0.001 }\n  schedule { max_steps: 1 batch_size: 1 }\n" +
         checkpoint + "}\n";
}

struct Measured {
  uintmax_t bytes = 0;
  double save_seconds = 0;
  std::string files;  // "name size, ..." of the final checkpoint
};

// `engine run --verbose PIPELINE --output_dir=OUT` in a child, its log in OUT.log.
Measured Run(const fs::path& engine, const fs::path& pipeline, const fs::path& out) {
  const fs::path log = out.string() + ".log";
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    const std::string output_dir = "--output_dir=" + out.string();
    ::execl(engine.c_str(), engine.c_str(), "run", "--verbose", pipeline.c_str(),
            output_dir.c_str(), nullptr);
    _exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "engine run %s failed (status %d); see %s\n", pipeline.c_str(), status,
                 log.c_str());
    std::exit(1);
  }
  Measured measured;
  const fs::path final_dir = out / "s" / "final";
  for (const auto& file : fs::directory_iterator(final_dir)) {
    measured.bytes += file.file_size();
    char size[32];
    std::snprintf(size, sizeof(size), " %.2f MB", static_cast<double>(file.file_size()) / 1e6);
    measured.files += (measured.files.empty() ? "" : ", ") + file.path().filename().string() + size;
  }
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  const std::regex written("checkpoint " + final_dir.string() + " written in ([0-9.e+-]+) s");
  std::smatch match;
  const std::string log_text = text.str();
  if (!std::regex_search(log_text, match, written)) {
    std::fprintf(stderr, "no save time for %s in %s\n", final_dir.c_str(), log.c_str());
    std::exit(1);
  }
  measured.save_seconds = std::stod(match[1]);
  return measured;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Shape shape;
  if (argc > 1) shape.layers = std::strtol(argv[1], nullptr, 10);
  const fs::path engine = fs::canonical("/proc/self/exe").parent_path() / "engine";
  const fs::path dir =
      fs::temp_directory_path() / ("checkpoint_bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "docs.txt") << "one document here\n\nanother document here\n\n"
                                     "a third one here\n";
  const double model_bytes = static_cast<double>(bench::WriteSyntheticLlama(dir / "model", shape));
  std::ofstream(dir / "slim.pbtxt") << Pipeline("");
  std::ofstream(dir / "whole.pbtxt") << Pipeline("  checkpoint { self_contained: true }\n");
  const Measured whole = Run(engine, dir / "whole.pbtxt", dir / "whole");
  const Measured slim = Run(engine, dir / "slim.pbtxt", dir / "slim");
  std::error_code removed;
  engine::RemoveTree(dir, removed);  // not fs::remove_all: see core/remove_tree.h
  const double mb = 1e6;
  std::printf(
      "QLoRA stage (nf4 on model.layers.*, LoRA r 8 on q_proj, v_proj), %lld layers, %.2f "
      "GB bf16 model\n",
      static_cast<long long>(shape.layers), model_bytes / 1e9);
  std::printf("  self-contained checkpoint  %9.1f MB  saved in %6.2f s\n", whole.bytes / mb,
              whole.save_seconds);
  std::printf("  slim checkpoint            %9.1f MB  saved in %6.2f s\n", slim.bytes / mb,
              slim.save_seconds);
  std::printf("    %s\n", slim.files.c_str());
  std::printf("  slim / self-contained      %9.4fx bytes (goal <= 0.02), %.4fx save time\n",
              static_cast<double>(slim.bytes) / static_cast<double>(whole.bytes),
              slim.save_seconds / whole.save_seconds);
  return 0;
}
