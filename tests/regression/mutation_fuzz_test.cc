// Bounded fuzzing of what users hand the engine: random mutations of a valid pipeline file and of a
// valid safetensors file, a fixed count with a fixed seed (the same inputs every run). Every input
// must be accepted or refused with a message; none may crash, hang or throw.
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "engine/safetensors.h"
#include "pipeline/pipeline_loader.h"
#include "testing/pipelines.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

// One random edit of `bytes`, biased to the first `hot` bytes (a header) when `hot` > 0.
std::string Mutate(std::string bytes, size_t hot, std::mt19937& random) {
  auto position = [&](size_t size) -> size_t {
    if (size == 0) return 0;
    const size_t range = hot > 0 && random() % 4 != 0 ? std::min(hot, size) : size;
    return random() % range;
  };
  static const std::string kSyntax = "{}[]:\"\\\n #0123456789.-e\xff\x80";
  const int edits = 1 + static_cast<int>(random() % 3);
  for (int e = 0; e < edits; ++e) {
    const size_t at = position(bytes.size());
    switch (random() % 5) {
      case 0:  // flip a byte
        if (!bytes.empty()) bytes[at] = static_cast<char>(bytes[at] ^ (1 + random() % 255));
        break;
      case 1:  // insert a character that matters to the syntax
        bytes.insert(at, 1, kSyntax[random() % kSyntax.size()]);
        break;
      case 2:  // delete a span
        bytes.erase(at, 1 + random() % 16);
        break;
      case 3:  // duplicate a span
        bytes.insert(at, bytes.substr(at, 1 + random() % 32));
        break;
      default:  // cut the end off
        bytes.resize(at);
        break;
    }
  }
  return bytes;
}

TEST(MutationFuzzTest, PipelineFilesAreAcceptedOrRefusedWithAMessage) {
  testing::TempDir dir;
  PluginRegistry registry;
  ASSERT_TRUE(registry.LoadDirectory(testing::kBuiltinPluginDir).ok());
  const std::string valid =
      "name: \"fuzz\"\noutput_dir: \"out\"\nseed: 7\n" +
      testing::DigitsStage("a",
                           "  schedule { epochs: 2 batch_size: 16 }\n"
                           "  optimizer { learning_rate: 0.01 }") +
      testing::DigitsStage("b", "  from_stage: \"a\"\n  schedule { max_steps: 5 }");
  std::mt19937 random(2026);
  int accepted = 0;
  for (int i = 0; i < 400; ++i) {
    const std::string text = Mutate(valid, 0, random);
    const auto file = dir.Write("p.pbtxt", text);
    Diagnostics diagnostics;
    auto pipeline = LoadPipeline(file, {}, &registry, &diagnostics);
    if (pipeline != nullptr) {
      EXPECT_TRUE(diagnostics.empty()) << text;
      ++accepted;
      continue;
    }
    ASSERT_FALSE(diagnostics.empty()) << "refused without a message:\n" << text;
    for (const Diagnostic& d : diagnostics.entries()) EXPECT_FALSE(d.message.empty()) << text;
  }
  // The mutations are not all fatal: some land in values that stay valid.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, 400);
}

TEST(MutationFuzzTest, SafetensorsFilesAreReadOrRefusedWithAMessage) {
  testing::TempDir dir;
  const auto valid_path = dir.path() / "valid.safetensors";
  ASSERT_TRUE(safetensors::Write(valid_path,
                                 {{"w", at::ones({4, 3})},
                                  {"b", at::ones({5}).to(at::kBFloat16)},
                                  {"ids", at::arange(6, at::kLong)}},
                                 {{"format", "pt"}})
                  .ok());
  const std::string valid = testing::ReadText(valid_path);
  size_t header = 0;  // the 8-byte little-endian length, then the JSON header
  for (int b = 7; b >= 0; --b) header = header * 256 + static_cast<unsigned char>(valid[b]);
  header += 8;
  std::mt19937 random(2026);
  int opened = 0;
  for (int i = 0; i < 800; ++i) {
    const std::string bytes = Mutate(valid, header, random);
    const auto path = dir.Write("m.safetensors", bytes);
    auto file = safetensors::File::Open(path);
    if (!file.ok()) {
      EXPECT_FALSE(file.status().message().empty());
      continue;
    }
    ++opened;
    auto all = (*file)->GetAll();
    if (!all.ok()) {
      EXPECT_FALSE(all.status().message().empty());
    }
  }
  EXPECT_GT(opened, 0);
  EXPECT_LT(opened, 800);
}

}  // namespace
}  // namespace engine
