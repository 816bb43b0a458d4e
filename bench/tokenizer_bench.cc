// Encode throughput (MB/s of UTF-8 text) of our tokenizer.json implementation against Hugging
// Face's tokenizers library (Rust, called from Python one line at a time as ours is:
// bench/tokenizer_bench_reference.py) on the same text, for each fixture layout, and of
// SentencePiece (a BPE model of similar size trained here on the same text) through the engine's
// Tokenizer.
//
//   tokenizer_bench [--text FILE] [--repeats N]     (default: data/fortunes.txt, 3)
//
// Every line of the text is encoded on its own, as data loaders do with documents; the best of N
// passes is reported.
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/tokenizer.h"
#include "testing/test_paths.h"
#include "tokenizer/hf_tokenizer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::vector<std::string> ReadLines(const fs::path& path, size_t* bytes) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> lines;
  *bytes = 0;
  for (std::string line; std::getline(in, line);) {
    *bytes += line.size() + 1;
    lines.push_back(line);
  }
  return lines;
}

template <typename Encode>
double BestSeconds(const std::vector<std::string>& lines, int repeats, Encode encode,
                   int64_t* tokens) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    *tokens = 0;
    for (const std::string& line : lines) *tokens += static_cast<int64_t>(encode(line).size());
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

// The reference's best time, or a negative number when it cannot run.
double ReferenceSeconds(const fs::path& tokenizer, const fs::path& text, int repeats,
                        int64_t* tokens) {
  const fs::path script =
      fs::path(engine::testing::kSourceDir) / "bench/tokenizer_bench_reference.py";
  const std::string command = std::string("'") + engine::testing::kPython + "' '" +
                              script.string() + "' '" + tokenizer.string() + "' '" + text.string() +
                              "' " + std::to_string(repeats);
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer;
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;)
    output.append(buffer.data(), n);
  if (pclose(pipe) != 0) return -1;
  const auto json = nlohmann::json::parse(output, nullptr, false);
  if (!json.is_object()) return -1;
  *tokens = json["tokens"].get<int64_t>();
  return json["seconds"].get<double>();
}

// A SentencePiece BPE model of `vocab` pieces trained on `text`, through the engine's Tokenizer.
std::unique_ptr<engine::Tokenizer> TrainSentencePiece(const fs::path& text, int vocab) {
  const fs::path dir = fs::temp_directory_path() / "engine_tokenizer_bench";
  fs::create_directories(dir);
  const std::string flags = "--input=" + text.string() +
                            " --model_prefix=" + (dir / "sp").string() +
                            " --vocab_size=" + std::to_string(vocab) +
                            " --model_type=bpe --minloglevel=2 --input_sentence_size=200000";
  const std::string command =
      std::string("'") + engine::testing::kSpmTrainFixture + "' '" + flags + "' >/dev/null 2>&1";
  if (std::system(command.c_str()) != 0) return nullptr;
  engine::proto::TokenizerOptions options;
  options.set_kind(engine::proto::TokenizerOptions::SENTENCEPIECE);
  options.set_model_file((dir / "sp.model").string());
  auto tokenizer = engine::MakeTokenizer(options, dir);
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path text = fs::path(engine::testing::kDataDir) / "fortunes.txt";
  int repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--text") text = argv[i + 1];
    if (arg == "--repeats") repeats = std::atoi(argv[i + 1]);
  }
  size_t bytes = 0;
  const std::vector<std::string> lines = ReadLines(text, &bytes);
  const double megabytes = static_cast<double>(bytes) / 1e6;
  std::printf("encoding %s (%.2f MB, %zu lines), best of %d passes\n", text.c_str(), megabytes,
              lines.size(), repeats);
  std::printf("%-20s %10s %12s %10s %12s %8s\n", "tokenizer", "ours MB/s", "ours tokens", "HF MB/s",
              "HF tokens", "ours/HF");
  const fs::path fixtures = fs::path(engine::testing::kSourceDir) / "tests/fixtures/tokenizers";
  for (const char* name : {"llama3_bpe.json", "qwen2_bpe.json", "mistral_bpe.json",
                           "llama2_bpe.json", "t5_unigram.json", "albert_unigram.json",
                           "unigram_bytes.json", "bert_wordpiece.json", "wordpiece_cased.json"}) {
    auto tokenizer = engine::tokenizer::HfTokenizer::FromFile(fixtures / name);
    if (!tokenizer.ok()) {
      std::cerr << tokenizer.status().message() << "\n";
      return 1;
    }
    int64_t ours_tokens = 0, hf_tokens = 0;
    const double ours = BestSeconds(
        lines, repeats, [&](const std::string& line) { return (*tokenizer)->Encode(line, false); },
        &ours_tokens);
    const double hf = ReferenceSeconds(fixtures / name, text, repeats, &hf_tokens);
    std::printf("%-20s %10.2f %12lld %10.2f %12lld %8.2f\n", name, megabytes / ours,
                static_cast<long long>(ours_tokens), hf > 0 ? megabytes / hf : 0.0,
                static_cast<long long>(hf_tokens), hf > 0 ? hf / ours : 0.0);
  }
  if (auto sentencepiece = TrainSentencePiece(text, 1000)) {
    int64_t tokens = 0;
    const double seconds = BestSeconds(
        lines, repeats, [&](const std::string& line) { return sentencepiece->Encode(line); },
        &tokens);
    std::printf("%-20s %10.2f %12lld   (SentencePiece BPE, 1000 pieces, same text)\n",
                "sentencepiece", megabytes / seconds, static_cast<long long>(tokens));
  } else {
    std::printf("sentencepiece: training the comparison model failed\n");
  }
  return 0;
}
