#include "run/generation_prompts.h"

#include <ATen/ops/cat.h>

#include <fstream>
#include <optional>

#include "chat/chat_template.h"
#include "engine/image_file.h"
#include "engine/image_tokens.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

// The images of a line ("images": [...] or "image"), relative to its file.
StatusOr<std::vector<fs::path>> LineImages(const nlohmann::ordered_json& json, const fs::path& dir,
                                           const std::string& origin) {
  std::vector<fs::path> images;
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

StatusOr<Prompt> PromptFromLine(const std::string& line, const std::string& origin, bool raw,
                                const fs::path& dir) {
  const auto json = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !(json.contains("messages") || json.contains("prompt"))) {
    return InvalidArgumentError(origin +
                                ": expected a JSON object with \"messages\" or \"prompt\"");
  }
  Prompt prompt;
  prompt.origin = origin;
  for (const char* key : {"videos", "video"}) {
    if (json.contains(key) && !json[key].is_null()) {
      return InvalidArgumentError(origin + ": \"" + key +
                                  "\": engine generate reads images, not videos, in prompts "
                                  "(the chat loader trains on videos)");
    }
  }
  ENGINE_ASSIGN_OR_RETURN(prompt.images, LineImages(json, dir, origin));
  if (raw && !prompt.images.empty()) {
    return InvalidArgumentError(origin + ": images need the chat template (no --raw)");
  }
  if (json.contains("messages")) {
    if (raw) {
      return InvalidArgumentError(origin + ": \"messages\" need the chat template (no --raw)");
    }
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
  for (const fs::path& path : prompt->images) {
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

}  // namespace

std::vector<Prompt> PromptsFromTexts(const std::vector<std::string>& texts,
                                     const std::vector<std::string>& images,
                                     const std::string& system, bool raw) {
  std::vector<Prompt> prompts;
  for (size_t i = 0; i < texts.size(); ++i) {
    Prompt prompt;
    prompt.origin = "--prompt " + std::to_string(i + 1);
    prompt.images.assign(images.begin(), images.end());
    if (raw) {
      prompt.text = texts[i];
    } else {
      prompt.messages = nlohmann::ordered_json::array();
      if (!system.empty()) prompt.messages.push_back({{"role", "system"}, {"content", system}});
      prompt.messages.push_back(
          {{"role", "user"}, {"content", WithImagePlaceholders(images.size(), texts[i])}});
    }
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

StatusOr<std::vector<Prompt>> ReadPromptFile(const fs::path& file, bool raw) {
  std::ifstream in(file);
  if (!in) return NotFoundError("--input: cannot open '" + file.string() + "'");
  std::vector<Prompt> prompts;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ENGINE_ASSIGN_OR_RETURN(Prompt prompt,
                            PromptFromLine(line, file.string() + ":" + std::to_string(number), raw,
                                           file.parent_path()));
    prompts.push_back(std::move(prompt));
  }
  if (in.bad()) return IoError("--input: cannot read '" + file.string() + "'");
  return prompts;
}

// The rendered conversation's ids (its template writes any bos), or bos and the raw text, as the
// data loaders encode a document.
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

}  // namespace engine
