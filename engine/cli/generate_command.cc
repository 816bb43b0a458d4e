// `engine generate`: talk to a model directory or a trained stage. Prompts (from --prompt or a
// JSONL file, with images for a vision-language model) are rendered with the model's chat
// template unless --raw, encoded, left-padded into batches and continued by the model's
// TextGenerator (ImageTextGenerator when a batch has images) until a stop id or --max_new_tokens.
#include <ATen/core/Tensor.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/arguments.h"
#include "cli/commands.h"
#include "engine/json_text.h"
#include "engine/text_generator.h"
#include "run/generation_prompts.h"
#include "run/generation_source.h"
#include "run/prompt_replies.h"

namespace engine::cli {

std::string GenerateHelp() {
  return R"(usage: engine generate SOURCE (--prompt=TEXT ... | --input=FILE.jsonl) [flags]

Continues prompts with a model. SOURCE is
  DIR                    a Hugging Face model directory (config.json, model.safetensors and
                         tokenizer.json or tokenizer.model): a `pretrained` directory, or the
                         final checkpoint of a stage that trained the whole model
  PIPELINE.pbtxt[:STAGE] a trained stage (default: the last in run order), built as its training
                         built it (adapters, 4-bit weights, precision, device) from its final
                         checkpoint, with its data's tokenizer

Each prompt is a user message rendered with the model's chat template (tokenizer_config.json or
chat_template.jinja) and the generation prompt, as transformers' apply_chat_template does; with
--raw it is text to continue, after the tokenizer's bos. Generation stops at the tokenizer's eos or
any eos_token_id of config.json and generation_config.json, or after --max_new_tokens. Greedy by
default; --temperature above 0 samples, reproducibly for one --seed. On a terminal, a single
prompt's reply is printed as it is generated.

  --prompt=TEXT          a prompt (repeat for several, generated as one batch)
  --input=FILE.jsonl     one prompt per line: {"messages": [{"role": ..., "content": ...}, ...]}
                         (a conversation to continue) or {"prompt": "..."}, with "images" paths
                         relative to the file
  --image=PATH           an image (PNG or JPEG) shown before the text of each --prompt (repeat
                         for several); for a vision-language model with its image processor
                         (preprocessor_config.json beside the tokenizer). --input lines name
                         theirs as the chat data does ("images": [...], <image> in the text)
  --system=TEXT          a system message before each --prompt (not with --raw)
  --raw                  continue the text as it is, without the chat template
  --max_new_tokens=N     at most N new tokens per prompt (default 128)
  --temperature=T        0: greedy (default); above 0: sample from the logits divided by T
  --top_k=K              sample among the K most likely tokens (0: all; default)
  --top_p=P              sample among the most likely tokens whose probability reaches P (1: all)
  --seed=N               the sampling seed (default 0)
  --batch_size=N         prompts generated together (default 8)
  --format=text|json     json: {"source", "outputs": [{"prompt", "prompt_text", "text", "ids",
                         "finish_reason"}]}: prompt_text is the text the model continued (the
                         rendered conversation), finish_reason "stop" (a stop id) or "length"
  --checkpoint=DIR       with a pipeline: a checkpoint of the stage instead of its final one
  --output_dir=DIR       with a pipeline: its outputs are here instead of its output_dir
  --dtype=auto|float32|bfloat16|float16
                         with a model directory: the dtype to compute in (auto: as stored)
  --device=cpu|cuda[:N]  with a model directory: where to compute (default cpu)
  --plugin_path=DIRS     more plugin directories (as for check)
  --base_path=DIRS       with a pipeline: where to look for the base of a slim checkpoint whose
                         base moved (as for eval)

Exit status 0 when every prompt was generated, 1 when the source cannot generate (no tokenizer,
no chat template without --raw, a prompt too long for the model, ...), 2 for a wrong command line.
)";
}

namespace {

struct GenerateFlags {
  GenerationOptions generation;
  std::string format = "text";
  std::string system;
  bool raw = false;
  int64_t batch_size = 8;
};

// The prompts of --prompt (with --image and --system) and of --input's lines.
StatusOr<std::vector<Prompt>> ReadPrompts(const Arguments& a, const GenerateFlags& flags) {
  std::vector<Prompt> prompts =
      PromptsFromTexts(a.GetAll("prompt"), a.GetAll("image"), flags.system, flags.raw);
  if (a.Has("input")) {
    ENGINE_ASSIGN_OR_RETURN(std::vector<Prompt> lines, ReadPromptFile(a.Get("input"), flags.raw));
    for (Prompt& prompt : lines) prompts.push_back(std::move(prompt));
  }
  if (prompts.empty()) return InvalidArgumentError("no prompts (give --prompt or --input)");
  return prompts;
}

// Prints a single reply as it grows, holding back a trailing incomplete UTF-8 character.
class ReplyStreamer {
 public:
  ReplyStreamer(const Tokenizer& tokenizer, std::vector<int64_t> stop_ids)
      : tokenizer_(tokenizer), stop_ids_(std::move(stop_ids)) {}

  void OnStep(const at::Tensor& step) {
    if (stopped_) return;
    const int64_t id = step[0].item<int64_t>();
    if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
      stopped_ = true;
      return;
    }
    ids_.push_back(id);
    const std::string text = tokenizer_.Decode(ids_);
    if (text.size() < printed_ || text.compare(0, printed_, text, 0, printed_) != 0) return;
    if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return;
    std::cout << text.substr(printed_) << std::flush;
    printed_ = text.size();
  }
  size_t printed() const { return printed_; }

 private:
  const Tokenizer& tokenizer_;
  std::vector<int64_t> stop_ids_;
  std::vector<int64_t> ids_;
  size_t printed_ = 0;
  bool stopped_ = false;
};

void PrintReplies(const std::vector<Prompt>& prompts, const std::vector<Reply>& replies,
                  const GenerationSource& source, const GenerateFlags& flags,
                  const ReplyStreamer* streamer) {
  if (flags.format == "json") {
    nlohmann::json outputs = nlohmann::json::array();
    for (size_t i = 0; i < replies.size(); ++i) {
      outputs.push_back(
          {{"prompt", prompts[i].messages.is_null() ? nlohmann::json(prompts[i].text)
                                                    : nlohmann::json(prompts[i].messages)},
           {"prompt_text", prompts[i].text},
           {"text", replies[i].text},
           {"ids", replies[i].ids},
           {"finish_reason", replies[i].stopped ? "stop" : "length"}});
    }
    std::cout << JsonText({{"source", source.description()}, {"outputs", outputs}}, 2) << "\n";
    return;
  }
  if (streamer != nullptr) {
    std::cout << replies[0].text.substr(std::min(streamer->printed(), replies[0].text.size()))
              << "\n";
    return;
  }
  for (size_t i = 0; i < replies.size(); ++i) {
    if (replies.size() > 1) std::cout << "--- " << prompts[i].origin << "\n";
    std::cout << replies[i].text << "\n";
  }
}

// The flags as GenerateFlags; a.error says what is wrong.
GenerateFlags ReadGenerateFlags(Arguments& a) {
  GenerateFlags flags;
  GenerationOptions& g = flags.generation;
  flags.raw = a.switches.count("raw") > 0;
  flags.format = ReadTextOrJsonFormat(&a);
  flags.system = a.Get("system");
  int64_t seed = 0;
  ReadIntFlag("max_new_tokens", 1, 1000000, &a, &g.max_new_tokens);
  ReadDoubleFlag("temperature", 0, 1e6, &a, &g.temperature);
  ReadIntFlag("top_k", 0, std::numeric_limits<int32_t>::max(), &a, &g.top_k);
  ReadDoubleFlag("top_p", 1e-9, 1, &a, &g.top_p);
  ReadIntFlag("seed", 0, std::numeric_limits<int64_t>::max(), &a, &seed);
  ReadIntFlag("batch_size", 1, 4096, &a, &flags.batch_size);
  g.seed = static_cast<uint64_t>(seed);
  if (a.error.empty() && flags.raw && a.Has("system")) a.error = "--system needs the chat template";
  if (a.error.empty() && flags.raw && a.Has("image")) a.error = "--image needs the chat template";
  if (a.error.empty() && a.positional.size() != 1) a.error = "expected one SOURCE";
  return flags;
}

}  // namespace

int GenerateCommand(const std::vector<std::string>& args) {
  Arguments a =
      ParseArguments(args,
                     {"prompt", "input", "image", "system", "max_new_tokens", "temperature",
                      "top_k", "top_p", "seed", "batch_size", "format", "checkpoint", "output_dir",
                      "dtype", "device", "plugin_path", "base_path"},
                     {"raw"});
  if (a.help) {
    std::cout << GenerateHelp();
    return kExitOk;
  }
  const GenerateFlags flags = ReadGenerateFlags(a);
  if (!a.error.empty()) {
    std::cerr << "engine generate: " << a.error << "\n\n" << GenerateHelp();
    return kExitUsage;
  }
  GenerationSourceOptions source_options;
  source_options.plugin_path = a.Get("plugin_path");
  source_options.base_path = a.Get("base_path");
  source_options.checkpoint = a.Get("checkpoint");
  source_options.output_dir = a.Get("output_dir");
  source_options.dtype = a.Get("dtype", "auto");
  source_options.device = a.Get("device", "cpu");
  const auto fail = [](const Status& status) {
    std::cerr << "engine generate: " << status.message() << "\n";
    return kExitFailure;
  };
  StatusOr<std::vector<Prompt>> prompts = ReadPrompts(a, flags);
  if (!prompts.ok()) return fail(prompts.status());
  auto source = GenerationSource::Open(a.positional[0], source_options);
  if (!source.ok()) return fail(source.status());
  PrintNotes((*source)->notes());
  auto encoded = EncodePrompts(*prompts, **source, flags.raw);
  if (!encoded.ok()) return fail(encoded.status());
  std::optional<ReplyStreamer> streamer;
  if (flags.format == "text" && prompts->size() == 1 && isatty(STDOUT_FILENO)) {
    streamer.emplace((*source)->tokenizer(), (*source)->stop_ids());
  }
  GenerationOptions options = flags.generation;
  if (streamer) {
    options.on_step = [&streamer](const at::Tensor& step) { streamer->OnStep(step.cpu()); };
  }
  std::vector<Reply> replies;
  Status status = (*source)->WithModel([&](Model& model) -> Status {
    ENGINE_ASSIGN_OR_RETURN(
        replies, GenerateReplies(model, **source, *prompts, *encoded, options, flags.batch_size));
    return Status::Ok();
  });
  if (!status.ok()) return fail(status);
  PrintReplies(*prompts, replies, **source, flags, streamer ? &*streamer : nullptr);
  return kExitOk;
}

}  // namespace engine::cli
