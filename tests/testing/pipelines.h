// Pipeline texts for tests: one stage of the mlp on the real digits data, or of a small Llama on
// the chat fixture.
#pragma once

#include <string>

#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine::testing {

// `stage_extra` goes inside the stage; `model_options` inside MlpOptions.
inline std::string DigitsStage(const std::string& name, const std::string& stage_extra,
                               const std::string& model_options = "") {
  return "stage {\n  name: \"" + name +
         "\"\n  model { plugin: \"mlp\" options { [type.googleapis.com/engine.plugins.MlpOptions] "
         "{ " +
         model_options +
         " } } }\n  data { plugin: \"digits\" options { "
         "[type.googleapis.com/engine.plugins.DigitsOptions] { path: \"" +
         DigitsDataPath().string() + "\" } } }\n" + stage_extra + "\n}\n";
}

inline std::string Precision(const std::string& policy, const std::string& options = "") {
  return "  precision { plugin: \"" + policy + "\"" +
         (options.empty() ? std::string()
                          : " options { [type.googleapis.com/engine.proto.PrecisionOptions] { " +
                                options + " } }") +
         " }\n";
}

// Two mlp stages on the digits, "b" starting from "a"'s final weights. Stage b exercises all the
// state a resume must restore: dropout (random generators), gradient accumulation, f32 loss scaling
// that overflows and grows (the scaled_fp32 fixture), AdamW slots, and 46 steps over two epochs
// with a checkpoint every 5 (a scaler mid-way between growths). `header` goes at the top level
// (callbacks, ...); `a_extra`/`b_extra` inside the stages. Relative to the file: output in out/.
inline std::string TwoStageDigitsPipeline(const std::string& header = "",
                                          const std::string& a_extra = "",
                                          const std::string& b_extra = "") {
  const std::string plugins = std::string(kTestPluginDir);
  return "output_dir: \"out\"\nplugin_path: \"" + plugins + "/scaled_fp32\"\nplugin_path: \"" +
         plugins + "/signal_callback\"\n" + header + "\n" +
         DigitsStage("a",
                     Precision("fp32") +
                         "  optimizer { learning_rate: 0.01 }\n"
                         "  schedule { epochs: 1 batch_size: 64 }\n" +
                         a_extra,
                     "hidden_units: 32") +
         DigitsStage("b",
                     "  from_stage: \"a\"\n" +
                         Precision("scaled_fp32",
                                   "loss_scaling { initial_scale: 1e37 growth_interval: 3 }") +
                         "  optimizer { learning_rate: 0.003 }\n"
                         "  schedule { epochs: 2 batch_size: 32 gradient_accumulation_steps: 2 "
                         "checkpoint_every_steps: 5 }\n" +
                         b_extra,
                     "hidden_units: 32 dropout: 0.3");
}

// A pipeline-level callback that sends `signal` ("KILL", "INT", "TERM") to the engine itself after
// step `step` of stage `stage`.
inline std::string SignalAt(const std::string& stage, int step, const std::string& signal,
                            bool to_parent = false) {
  return "callback { plugin: \"signal_callback\" options { "
         "[type.googleapis.com/engine.fixtures.SignalCallbackOptions] { stage: \"" +
         stage + "\" at_step: " + std::to_string(step) + " signal: \"" + signal + "\"" +
         (to_parent ? " to_parent: true" : "") + " } } }\n";
}

// The `chat` data block of the chat fixture's six conversations (qwen2_bpe.json, its chat
// template), `eval_fraction` of them held out.
inline std::string ChatFixtureData(const std::string& eval_fraction) {
  const std::string fixtures = std::string(testing::kSourceDir) + "/tests/fixtures/";
  return "data { plugin: \"chat\" options { [type.googleapis.com/engine.plugins.ChatOptions] { "
         "path: \"" +
         fixtures + "chat_data/conversations.jsonl\" eval_fraction: " + eval_fraction +
         " tokenizer { kind: HF_JSON path: \"" + fixtures +
         "tokenizers/qwen2_bpe.json\" config: \"" + fixtures +
         "chat_data/tokenizer_config.json\" } } } }\n";
}

// One stage of a small Llama on the chat fixture's conversations (4 to train on, 2 held out):
// the loss counts the assistants' tokens only, so batches hold different numbers of loss terms,
// which the model counts on its device. `extra` goes inside the stage.
inline std::string ChatLlamaStage(const std::string& name, const std::string& extra,
                                  const std::string& eval_fraction = "0.2") {
  return "stage { name: \"" + name +
         "\"\n model { plugin: \"llama\" options { "
         "[type.googleapis.com/engine.transformer.LlamaOptions] { hidden_size: 32 "
         "num_hidden_layers: 2 num_attention_heads: 4 num_key_value_heads: 2 } } }\n " +
         ChatFixtureData(eval_fraction) + extra + "\n}\n";
}

}  // namespace engine::testing
