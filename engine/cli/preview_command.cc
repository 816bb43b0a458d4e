// `engine preview`: the first examples of a stage's data as the model will see them, decoded,
// with the tokens that carry loss marked; how users debug chat templates and loss masks.
#include <ATen/core/Tensor.h>
#include <unistd.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/arguments.h"
#include "cli/commands.h"
#include "engine/image_tokens.h"
#include "engine/tokenizer.h"
#include "run/pipeline_session.h"
#include "text/stage_tokenizer.h"

namespace engine::cli {
namespace {

constexpr int64_t kIgnoreIndex = -100;

struct PreviewExample {
  std::vector<int64_t> ids;
  std::vector<int> loss;  // 1 where the token carries loss
};

// The data loader's tokenizer, if it has one.
std::unique_ptr<Tokenizer> DataTokenizer(const ResolvedStage& stage,
                                         const std::filesystem::path& base_dir) {
  const auto options = StageTokenizerOptions(stage);
  if (!options) return nullptr;
  auto tokenizer = MakeTokenizer(*options, base_dir);
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

// The batch's rows without their padding; every token carries loss where there are no labels.
std::vector<PreviewExample> Examples(const Batch& batch) {
  const at::Tensor ids = batch.at("input_ids").contiguous();
  const auto labels = batch.find("labels");
  const auto mask = batch.find("attention_mask");
  const bool token_labels = labels != batch.end() && labels->second.sizes() == ids.sizes();
  std::vector<PreviewExample> out;
  for (int64_t b = 0; b < ids.size(0); ++b) {
    PreviewExample example;
    for (int64_t t = 0; t < ids.size(1); ++t) {
      if (mask != batch.end() && mask->second[b][t].item<int64_t>() == 0) continue;
      example.ids.push_back(ids[b][t].item<int64_t>());
      example.loss.push_back(!token_labels || labels->second[b][t].item<int64_t>() != kIgnoreIndex);
    }
    out.push_back(std::move(example));
  }
  return out;
}

// "<|image_pad|>" repeated N times as "<|image_pad|>×N": an image's tokens, counted.
std::string CollapseImagePads(const std::string& text) {
  const std::string pad = kImagePadToken;
  std::string out;
  for (size_t at = 0; at < text.size();) {
    size_t count = 0;
    while (at + (count + 1) * pad.size() <= text.size() &&
           text.compare(at + count * pad.size(), pad.size(), pad) == 0) {
      ++count;
    }
    if (count >= 2) {
      out += pad + "\u00d7" + std::to_string(count);
      at += count * pad.size();
    } else {
      out += text[at++];
    }
  }
  return out;
}

// The text with the loss-carrying runs in green on a terminal, between [[ and ]] otherwise; an
// image's run of pad tokens as one, counted.
std::string MarkedText(const PreviewExample& example, const Tokenizer& tokenizer, bool colour) {
  std::string text;
  for (size_t begin = 0; begin < example.ids.size();) {
    size_t end = begin;
    while (end < example.ids.size() && example.loss[end] == example.loss[begin]) ++end;
    const std::string run = CollapseImagePads(tokenizer.DecodeWithSpecialTokens(
        std::vector<int64_t>(example.ids.begin() + begin, example.ids.begin() + end)));
    if (!example.loss[begin]) {
      text += run;
    } else {
      text += (colour ? "\033[32m" : "[[") + run + (colour ? "\033[0m" : "]]");
    }
    begin = end;
  }
  return text;
}

void Print(const std::vector<PreviewExample>& examples, const Tokenizer* tokenizer,
           const std::string& format, const std::string& stage, const std::string& split) {
  if (format == "json") {
    nlohmann::json list = nlohmann::json::array();
    for (const PreviewExample& example : examples) {
      nlohmann::json item = {{"input_ids", example.ids}, {"loss_mask", example.loss}};
      if (tokenizer != nullptr) item["text"] = tokenizer->DecodeWithSpecialTokens(example.ids);
      list.push_back(item);
    }
    std::cout << nlohmann::json{{"stage", stage}, {"split", split}, {"examples", list}}.dump(2)
              << "\n";
    return;
  }
  const bool colour = isatty(STDOUT_FILENO);
  for (size_t i = 0; i < examples.size(); ++i) {
    int64_t loss = 0;
    for (int l : examples[i].loss) loss += l;
    std::cout << "--- example " << i << ": " << examples[i].ids.size() << " tokens, " << loss
              << " carry loss" << (colour ? " (green)" : " (between [[ and ]])") << "\n";
    if (tokenizer != nullptr) {
      std::cout << MarkedText(examples[i], *tokenizer, colour) << "\n";
    } else {
      std::cout << nlohmann::json(examples[i].ids).dump() << "\n";
    }
  }
}

}  // namespace

std::string PreviewHelp() {
  return R"(usage: engine preview PIPELINE.pbtxt [--stage=NAME] [-n N] [--split=train|eval]
                      [--format=text|json]

Prints the first N (default 3) training examples of a stage's data (default: the first stage) as
the model will see them: the decoded text, special tokens included, with the tokens that carry
loss in green on a terminal (between [[ and ]] otherwise). With --format=json:
{"stage": ..., "split": ..., "examples": [{"input_ids": [...], "loss_mask": [...], "text": "..."}]}.
This is how to check a chat template and which tokens a model learns from. Nothing is written.

  --split=train|eval   the examples of the training split (default) or of the evaluation split,
                       in the order the stage evaluates them
  --plugin_path=DIRS   more plugin directories (as for check)
)";
}

int PreviewCommand(const std::vector<std::string>& raw) {
  std::vector<std::string> args = raw;
  for (std::string& arg : args) {
    if (arg == "-n") arg = "--n";
  }
  Arguments a = ParseArguments(args, {"format", "plugin_path", "stage", "n", "split"}, {});
  if (a.help) {
    std::cout << PreviewHelp();
    return kExitOk;
  }
  const std::string format = ReadTextOrJsonFormat(&a);
  int64_t n = 3;
  Split split = Split::kTrain;
  ReadSplitFlag(&a, &split);
  const std::string split_name(SplitName(split));
  if (a.error.empty()) {
    try {
      n = std::stoll(a.Get("n", "3"));
    } catch (...) {
      n = 0;
    }
    if (n < 1) a.error = "-n must be a positive number, not '" + a.Get("n") + "'";
  }
  if (a.error.empty() && a.positional.size() != 1) a.error = "expected one pipeline file";
  if (!a.error.empty()) {
    std::cerr << "engine preview: " << a.error << "\n\n" << PreviewHelp();
    return kExitUsage;
  }
  PipelineSession session;
  const bool planned =
      LoadAndPlanSession(a.positional[0], a.Get("plugin_path"), LoadOptions{}, &session);
  PrintNotes(session.notes);
  if (!planned) {
    std::cerr << session.diagnostics.ToString();
    return kExitFailure;
  }
  const StagePlan* stage = nullptr;
  for (const StagePlan& candidate : session.plan->stages) {
    if (!a.Has("stage") || candidate.stage->name == a.Get("stage")) {
      stage = &candidate;
      break;
    }
  }
  if (stage == nullptr) {
    std::cerr << "engine preview: no stage '" << a.Get("stage") << "' in " << a.positional[0]
              << "\n";
    return kExitFailure;
  }
  const int64_t available = split == Split::kEval ? stage->eval_examples : stage->train_examples;
  if (available == 0) {
    std::cerr << "engine preview: " << stage->stage->subject() << " has no " << split_name
              << " examples\n";
    return kExitFailure;
  }
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < std::min(n, available); ++i) indices.push_back(i);
  auto batch = stage->dataset->GetBatch(split, indices);
  if (!batch.ok() || batch->count("input_ids") == 0) {
    std::cerr << "engine preview: " << stage->stage->subject() << ": "
              << (batch.ok() ? "the data has no 'input_ids' to preview" : batch.status().message())
              << "\n";
    return kExitFailure;
  }
  const auto tokenizer = DataTokenizer(*stage->stage, session.pipeline->base_dir);
  Print(Examples(*batch), tokenizer.get(), format, stage->stage->name, split_name);
  return kExitOk;
}

}  // namespace engine::cli
