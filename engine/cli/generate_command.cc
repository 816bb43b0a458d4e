// `engine generate`: talk to a model directory or a trained stage. Prompts (from --prompt or a
// JSONL file, with images for a vision-language model) are rendered with the model's chat
// template unless --raw, encoded, left-padded into batches and continued by the model's
// TextGenerator (ImageTextGenerator when a batch has images) until a stop id or --max_new_tokens.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli/arguments.h"
#include "cli/commands.h"
#include "engine/image_batch.h"
#include "engine/image_file.h"
#include "engine/image_tokens.h"
#include "engine/json_text.h"
#include "engine/text_generator.h"
#include "run/generation_source.h"

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

struct Prompt {
  nlohmann::ordered_json messages;  // a conversation; null with --raw
  std::string text;                 // with --raw: the text; otherwise the rendered conversation
  std::string origin;               // "--prompt 2", "FILE:3", for errors
  std::vector<std::filesystem::path> images;  // shown where the messages say <image>
  ExampleImages pixels;                       // the images' patches and grids, once encoded
};

// The images of a line of --input ("images": [...] or "image"), relative to its file.
StatusOr<std::vector<std::filesystem::path>> LineImages(const nlohmann::ordered_json& json,
                                                        const std::filesystem::path& dir,
                                                        const std::string& origin) {
  std::vector<std::filesystem::path> images;
  for (const char* key : {"images", "image"}) {
    auto it = json.find(key);
    if (it == json.end() || it->is_null()) continue;
    const nlohmann::ordered_json list = it->is_array() ? *it : nlohmann::ordered_json::array({*it});
    for (const auto& image : list) {
      if (!image.is_string() || image.get<std::string>().empty()) {
        return InvalidArgumentError(origin + ": \"" + key + "\" must hold image paths");
      }
      images.push_back(dir / image.get<std::string>());
    }
  }
  return images;
}

// "<image><image>text": the images first, as Qwen2-VL's examples put them.
std::string WithImagePlaceholders(size_t images, const std::string& text) {
  std::string out;
  for (size_t i = 0; i < images; ++i) out += kImagePlaceholder;
  return out + text;
}

struct GenerateFlags {
  GenerationOptions generation;
  std::string format = "text";
  std::string system;
  bool raw = false;
  int64_t batch_size = 8;
};

// One prompt from a line of --input: {"messages": [...]} or {"prompt": "..."}, and its images.
StatusOr<Prompt> PromptFromLine(const std::string& line, const std::string& origin, bool raw,
                                const std::filesystem::path& dir) {
  const auto json = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !(json.contains("messages") || json.contains("prompt"))) {
    return InvalidArgumentError(origin +
                                ": expected a JSON object with \"messages\" or \"prompt\"");
  }
  Prompt prompt;
  prompt.origin = origin;
  ENGINE_ASSIGN_OR_RETURN(prompt.images, LineImages(json, dir, origin));
  if (raw && !prompt.images.empty()) {
    return InvalidArgumentError(origin + ": images need the chat template (no --raw)");
  }
  if (json.contains("messages")) {
    if (raw)
      return InvalidArgumentError(origin + ": \"messages\" need the chat template (no --raw)");
    ENGINE_RETURN_IF_ERROR(chat::ValidateConversation(json["messages"]).WithContext(origin));
    prompt.messages = json["messages"];
    return prompt;
  }
  if (!json["prompt"].is_string()) {
    return InvalidArgumentError(origin + ": \"prompt\" must be a string");
  }
  std::string text = json["prompt"].get<std::string>();
  if (raw) {
    prompt.text = text;
  } else {
    if (text.find(kImagePlaceholder) == std::string::npos) {
      text = WithImagePlaceholders(prompt.images.size(), text);
    }
    prompt.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", text}}});
  }
  return prompt;
}

StatusOr<std::vector<Prompt>> ReadPrompts(const Arguments& a, const GenerateFlags& flags) {
  std::vector<Prompt> prompts;
  const std::vector<std::string> texts = a.GetAll("prompt");
  const std::vector<std::string> images = a.GetAll("image");
  for (size_t i = 0; i < texts.size(); ++i) {
    Prompt prompt;
    prompt.origin = "--prompt " + std::to_string(i + 1);
    prompt.images.assign(images.begin(), images.end());
    if (flags.raw) {
      prompt.text = texts[i];
    } else {
      prompt.messages = nlohmann::ordered_json::array();
      if (!flags.system.empty()) {
        prompt.messages.push_back({{"role", "system"}, {"content", flags.system}});
      }
      prompt.messages.push_back(
          {{"role", "user"}, {"content", WithImagePlaceholders(images.size(), texts[i])}});
    }
    prompts.push_back(std::move(prompt));
  }
  if (a.Has("input")) {
    const std::string file = a.Get("input");
    std::ifstream in(file);
    if (!in) return NotFoundError("--input: cannot open '" + file + "'");
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      ENGINE_ASSIGN_OR_RETURN(Prompt prompt,
                              PromptFromLine(line, file + ":" + std::to_string(number), flags.raw,
                                             std::filesystem::path(file).parent_path()));
      prompts.push_back(std::move(prompt));
    }
    if (in.bad()) return IoError("--input: cannot read '" + file + "'");
  }
  if (prompts.empty()) return InvalidArgumentError("no prompts (give --prompt or --input)");
  return prompts;
}

// Reads the prompt's images through the source's image processor and gives each its image
// tokens in `ids`.
Status AddImages(const GenerationSource& source, Prompt* prompt, std::vector<int64_t>* ids) {
  if (prompt->images.empty()) return Status::Ok();
  const Qwen2VlImageProcessor* processor = source.image_processor();
  if (processor == nullptr) {
    return FailedPreconditionError(source.description() + " has no image processor (" +
                                   kImageProcessorFile +
                                   " beside its tokenizer) to read images with");
  }
  const std::vector<int64_t> pad = source.tokenizer().Encode(kImagePadToken);
  if (pad.size() != 1) {
    return FailedPreconditionError(std::string("the tokenizer has no ") + kImagePadToken +
                                   " token, which images need");
  }
  std::vector<int64_t> counts;
  std::vector<at::Tensor> patches;
  for (const std::filesystem::path& path : prompt->images) {
    ENGINE_ASSIGN_OR_RETURN(RgbImage image, ReadRgbImage(path));
    ENGINE_ASSIGN_OR_RETURN(ImageGrid grid, processor->GridFor(image.height, image.width));
    ENGINE_ASSIGN_OR_RETURN(at::Tensor values, processor->Patches(image));
    counts.push_back(processor->TokensFor(grid));
    patches.push_back(values);
    prompt->pixels.grids.push_back(grid);
  }
  prompt->pixels.patches = at::cat(patches);
  return ExpandImageTokens(pad[0], counts, ids, nullptr);
}

// The ids each prompt starts from: the rendered conversation (its template writes any bos), or
// bos and the raw text, as the data loaders encode a document.
StatusOr<std::vector<std::vector<int64_t>>> EncodePrompts(std::vector<Prompt>& prompts,
                                                          const GenerationSource& source,
                                                          bool raw) {
  std::optional<chat::ChatTemplate> chat_template;
  if (!raw) {
    if (source.chat() == nullptr) {
      return FailedPreconditionError(source.chat_absence() +
                                     "; give --raw to continue prompts as plain text");
    }
    ENGINE_ASSIGN_OR_RETURN(chat_template, source.chat()->Load());
  }
  std::vector<std::vector<int64_t>> encoded;
  for (Prompt& prompt : prompts) {
    std::vector<int64_t> ids;
    if (raw) {
      if (source.tokenizer().bos_id() >= 0) ids.push_back(source.tokenizer().bos_id());
    } else {
      const int64_t marked = MarkImagePlaceholders(&prompt.messages);
      if (marked != static_cast<int64_t>(prompt.images.size())) {
        return InvalidArgumentError(prompt.origin + ": " + std::to_string(marked) + " " +
                                    kImagePlaceholder + " placeholder(s) for " +
                                    std::to_string(prompt.images.size()) + " image(s)");
      }
      chat::ChatRenderOptions render;
      render.add_generation_prompt = true;
      ENGINE_ASSIGN_OR_RETURN(
          prompt.text, chat_template->Render(prompt.messages, render).WithContext(prompt.origin));
    }
    const std::vector<int64_t> body = source.tokenizer().Encode(prompt.text);
    ids.insert(ids.end(), body.begin(), body.end());
    if (ids.empty()) return InvalidArgumentError(prompt.origin + ": the prompt has no tokens");
    ENGINE_RETURN_IF_ERROR(AddImages(source, &prompt, &ids).WithContext(prompt.origin));
    encoded.push_back(std::move(ids));
  }
  return encoded;
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

struct Reply {
  std::vector<int64_t> ids;  // without the stop id
  std::string text;
  bool stopped = false;
};

// The images of prompts [begin, end) as the model reads them; an empty batch when none has any.
StatusOr<Batch> BatchImages(const std::vector<Prompt>& prompts, size_t begin, size_t end,
                            const GenerationSource& source, const at::Device& device) {
  std::vector<ExampleImages> rows;
  bool any = false;
  for (size_t i = begin; i < end; ++i) {
    rows.push_back(prompts[i].pixels);
    any = any || !prompts[i].pixels.grids.empty();
  }
  Batch images;
  if (!any) return images;
  PackImages(rows, source.image_processor()->patch_values(), &images);
  for (auto& [name, tensor] : images) tensor = tensor.to(device);
  return images;
}

// The replies of prompts [begin, end): one left-padded batch.
StatusOr<std::vector<Reply>> GenerateBatch(Model& model, TextGenerator& generator,
                                           const GenerationSource& source,
                                           const std::vector<Prompt>& prompts,
                                           const std::vector<std::vector<int64_t>>& encoded,
                                           size_t begin, size_t end, GenerationOptions options) {
  size_t length = 0;
  for (size_t i = begin; i < end; ++i) length = std::max(length, encoded[i].size());
  const int64_t rows = static_cast<int64_t>(end - begin);
  const int64_t pad = std::max<int64_t>(source.tokenizer().pad_id(), 0);
  at::Tensor ids = at::full({rows, static_cast<int64_t>(length)}, pad, at::kLong);
  at::Tensor mask = at::zeros({rows, static_cast<int64_t>(length)}, at::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    const auto& row = encoded[begin + r];
    const int64_t offset = static_cast<int64_t>(length - row.size());
    ids[r].narrow(0, offset, row.size()).copy_(at::tensor(row, at::kLong));
    mask[r].narrow(0, offset, row.size()).fill_(1);
  }
  at::Device device = at::kCPU;
  for (const at::Tensor& parameter : model.module().parameters()) {
    device = parameter.device();
    break;
  }
  ENGINE_ASSIGN_OR_RETURN(Batch images, BatchImages(prompts, begin, end, source, device));
  at::Tensor generated;
  if (images.empty()) {
    ENGINE_ASSIGN_OR_RETURN(generated,
                            generator.Generate(ids.to(device), mask.to(device), options));
  } else {
    auto* image_generator = dynamic_cast<ImageTextGenerator*>(&model);
    if (image_generator == nullptr) {
      return FailedPreconditionError("the model (" + model.architecture() +
                                     ") cannot read images: it does not implement "
                                     "engine::ImageTextGenerator");
    }
    ENGINE_ASSIGN_OR_RETURN(generated, image_generator->GenerateWithImages(
                                           ids.to(device), mask.to(device), images, options));
  }
  generated = generated.cpu();
  std::vector<Reply> replies(rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < generated.size(1); ++t) {
      const int64_t id = generated[r][t].item<int64_t>();
      if (std::find(options.stop_ids.begin(), options.stop_ids.end(), id) !=
          options.stop_ids.end()) {
        replies[r].stopped = true;
        break;
      }
      replies[r].ids.push_back(id);
    }
    replies[r].text = source.tokenizer().Decode(replies[r].ids);
  }
  return replies;
}

// Every prompt's reply, batch by batch; a single prompt on a terminal streams to stdout.
StatusOr<std::vector<Reply>> GenerateAll(Model& model, const GenerationSource& source,
                                         const std::vector<Prompt>& prompts,
                                         const std::vector<std::vector<int64_t>>& encoded,
                                         const GenerateFlags& flags, ReplyStreamer* streamer) {
  auto* generator = dynamic_cast<TextGenerator*>(&model);
  if (generator == nullptr) {
    return FailedPreconditionError("the model (" + model.architecture() +
                                   ") cannot generate text: it does not implement "
                                   "engine::TextGenerator");
  }
  GenerationOptions options = flags.generation;
  options.stop_ids = source.stop_ids();
  if (streamer != nullptr) {
    options.on_step = [streamer](const at::Tensor& step) { streamer->OnStep(step.cpu()); };
  }
  std::vector<Reply> replies;
  for (size_t begin = 0; begin < encoded.size(); begin += flags.batch_size) {
    const size_t end = std::min(encoded.size(), begin + static_cast<size_t>(flags.batch_size));
    StatusOr<std::vector<Reply>> batch =
        GenerateBatch(model, *generator, source, prompts, encoded, begin, end, options);
    if (!batch.ok() && encoded.size() > 1) {
      return batch.status().WithContext("prompts " + std::to_string(begin + 1) + "-" +
                                        std::to_string(end));
    }
    if (!batch.ok()) return batch.status();
    replies.insert(replies.end(), batch->begin(), batch->end());
  }
  return replies;
}

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
  std::vector<Reply> replies;
  Status status = (*source)->WithModel([&](Model& model) -> Status {
    ENGINE_ASSIGN_OR_RETURN(replies, GenerateAll(model, **source, *prompts, *encoded, flags,
                                                 streamer ? &*streamer : nullptr));
    return Status::Ok();
  });
  if (!status.ok()) return fail(status);
  PrintReplies(*prompts, replies, **source, flags, streamer ? &*streamer : nullptr);
  return kExitOk;
}

}  // namespace engine::cli
