// A Hugging Face model directory for tests that load `pretrained` models as users do.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>

#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine::testing {

// A model directory as a hub download has it: config.json, model.safetensors, tokenizer.json and
// tokenizer_config.json (with a chat template), in <tmp>/models/Llama-3.2-1B-Instruct, from a short
// run of the chat_sft pipeline's first stage.
inline std::filesystem::path MakeHubModel(TempDir& tmp) {
  namespace fs = std::filesystem;
  const fs::path source = kSourceDir;
  const auto pipeline =
      tmp.Write("base.pbtxt", R"(name: "base"
stage {
  name: "lm"
  model { plugin: "llama" options { [type.googleapis.com/engine.transformer.LlamaOptions] {
    hidden_size: 64 num_hidden_layers: 2 num_attention_heads: 4 num_key_value_heads: 2 } } }
  data { plugin: "text" options { [type.googleapis.com/engine.plugins.TextOptions] {
    path: ")" + FortunesDataPath().string() +
                                  R"(" document_separator: "%"
    sequence_length: 32 max_documents: 200 eval_fraction: 0.1
    tokenizer { kind: HF_JSON path: ")" +
                                  (source / "tests/fixtures/tokenizers/llama3_bpe.json").string() +
                                  R"("
                config: ")" + (source / "pipelines/llama3_chat_tokenizer_config.json").string() +
                                  R"(" } } } }
  optimizer { learning_rate: 0.003 }
  schedule { max_steps: 2 batch_size: 4 }
}
)");
  const auto run =
      RunEngine({"run", pipeline.string(), "--output_dir=" + (tmp.path() / "base_out").string()});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  const fs::path model = tmp.path() / "models/Llama-3.2-1B-Instruct";
  fs::create_directories(model);
  for (const char* file :
       {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(tmp.path() / "base_out/lm/final" / file, model / file);
  }
  return model;
}

}  // namespace engine::testing
