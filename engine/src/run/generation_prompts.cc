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

// The videos of a line (LineVideos, engine/image_tokens.h), relative to its file, and the rate
// their frames were taken at ("fps").
Status PromptVideos(const nlohmann::ordered_json& json, const fs::path& dir,
                    const std::string& origin, Prompt* prompt) {
  StatusOr<std::vector<std::vector<std::string>>> videos = LineVideos(json);
  if (!videos.ok()) return videos.status().WithContext(origin);
  for (const std::vector<std::string>& video : *videos) {
    std::vector<fs::path> frames;
    for (const std::string& frame : video) frames.push_back(dir / frame);
    prompt->videos.push_back(std::move(frames));
  }
  if (auto fps = json.find("fps"); fps != json.end() && !fps->is_null()) {
    if (!fps->is_number() || !(fps->get<double>() > 0) || fps->get<double>() > 1000) {
      return InvalidArgumentError(origin + ": \"fps\" must be a number above 0, at most 1000");
    }
    prompt->fps = fps->get<double>();
  }
  return Status::Ok();
}

// "<image><image><video>text": the images, then the videos, first, as Qwen2-VL's examples put
// them.
std::string WithPlaceholders(size_t images, size_t videos, const std::string& text) {
  std::string out;
  for (size_t i = 0; i < images; ++i) out += kImagePlaceholder;
  for (size_t i = 0; i < videos; ++i) out += kVideoPlaceholder;
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
  ENGINE_ASSIGN_OR_RETURN(prompt.images, LineImages(json, dir, origin));
  ENGINE_RETURN_IF_ERROR(PromptVideos(json, dir, origin, &prompt));
  if (raw && (!prompt.images.empty() || !prompt.videos.empty())) {
    return InvalidArgumentError(origin + ": images and videos need the chat template (no --raw)");
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
    if (text.find(kImagePlaceholder) == std::string::npos &&
        text.find(kVideoPlaceholder) == std::string::npos) {
      text = WithPlaceholders(prompt.images.size(), prompt.videos.size(), text);
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

// What the prompt's videos put in the text and the batch: each read through the video processor
// (its frames sampled as it samples them), its patches into prompt->video_pixels, the
// text each <video> becomes (Qwen3-VL's timestamps; empty: the usual tokens) into `texts`, and
// each <|video_pad|>'s token count into `pads`.
// The source's video processor: its video_processor_file(), else its image processor's file.
StatusOr<Qwen2VlImageProcessor> VideoProcessorOf(const GenerationSource& source) {
  const fs::path where = !source.video_processor_file().empty() ? source.video_processor_file()
                                                                : source.image_processor_file();
  if (where.empty()) {
    return FailedPreconditionError(source.description() + " has no video processor (" +
                                   kVideoProcessorFile + " or " + kImageProcessorFile +
                                   " beside its tokenizer) to read videos with");
  }
  return Qwen2VlImageProcessor::ReadForVideos(where);
}

Status ReadVideos(const Qwen2VlImageProcessor& processor, Prompt* prompt,
                  std::vector<std::string>* texts, std::vector<int64_t>* pads) {
  std::vector<at::Tensor> patches;
  for (const std::vector<fs::path>& video : prompt->videos) {
    const std::string what = "video '" + video.front().string() + "'";
    std::vector<fs::path> listed = video;
    if (video.size() == 1 && !fs::is_directory(video.front()) && !IsImageFileName(video.front())) {
      return InvalidArgumentError(what +
                                  " is neither a directory of frames nor an image file; this "
                                  "engine decodes no video files: extract its frames");
    }
    if (video.size() == 1 && fs::is_directory(video.front())) {
      StatusOr<std::vector<fs::path>> files = FrameFilesOf(video.front(), 100000);
      if (!files.ok()) return files.status().WithContext(what);
      listed = std::move(*files);
    }
    const std::vector<int64_t> kept =
        processor.SampledFrames(static_cast<int64_t>(listed.size()), prompt->fps);
    int64_t height = 0, width = 0;
    StatusOr<at::Tensor> values = processor.VideoPatches(
        static_cast<int64_t>(kept.size()), [&](int64_t i) -> StatusOr<RgbImage> {
          StatusOr<RgbImage> frame = ReadRgbImage(listed[static_cast<size_t>(kept[i])]);
          if (frame.ok() && i == 0) {
            height = frame->height;
            width = frame->width;
          }
          return frame;
        });
    if (!values.ok()) return values.status().WithContext(what);
    StatusOr<ImageGrid> grid =
        processor.VideoGridFor(static_cast<int64_t>(kept.size()), height, width);
    if (!grid.ok()) return grid.status().WithContext(what);
    patches.push_back(*values);
    prompt->video_pixels.grids.push_back(*grid);
    prompt->video_pixels.seconds_per_grid.push_back(
        static_cast<double>(processor.temporal_patch_size) / prompt->fps);
    const std::vector<int64_t> video_pads = processor.VideoPadTokens(*grid);
    pads->insert(pads->end(), video_pads.begin(), video_pads.end());
    texts->push_back(processor.video_kind == Qwen2VlImageProcessor::VideoKind::kQwen3Vl
                         ? Qwen3VideoText(processor.Timestamps(kept, prompt->fps))
                         : "");
  }
  prompt->video_pixels.patches = at::cat(patches);
  return Status::Ok();
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
          {{"role", "user"}, {"content", WithPlaceholders(images.size(), 0, texts[i])}});
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
  std::optional<Qwen2VlImageProcessor> video_processor;
  for (Prompt& prompt : prompts) {
    std::vector<int64_t> ids;
    std::vector<std::string> video_texts;
    std::vector<int64_t> video_pads;
    if (raw) {
      if (source.tokenizer().bos_id() >= 0) ids.push_back(source.tokenizer().bos_id());
    } else {
      const int64_t marked = MarkImagePlaceholders(&prompt.messages);
      if (marked != static_cast<int64_t>(prompt.images.size())) {
        return InvalidArgumentError(prompt.origin + ": " + std::to_string(marked) + " " +
                                    kImagePlaceholder + " placeholder(s) for " +
                                    std::to_string(prompt.images.size()) + " image(s)");
      }
      if (!prompt.videos.empty()) {
        if (!video_processor) {  // read once, for the first prompt with videos
          ENGINE_ASSIGN_OR_RETURN(video_processor,
                                  VideoProcessorOf(source).WithContext(prompt.origin));
        }
        ENGINE_RETURN_IF_ERROR(ReadVideos(*video_processor, &prompt, &video_texts, &video_pads)
                                   .WithContext(prompt.origin));
      }
      const int64_t videos = MarkVideoPlaceholders(&prompt.messages, video_texts);
      if (videos != static_cast<int64_t>(prompt.videos.size())) {
        return InvalidArgumentError(prompt.origin + ": " + std::to_string(videos) + " " +
                                    kVideoPlaceholder + " placeholder(s) for " +
                                    std::to_string(prompt.videos.size()) + " video(s)");
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
    if (!prompt.videos.empty()) {
      const std::vector<int64_t> pad = source.tokenizer().Encode(kVideoPadToken);
      if (pad.size() != 1) {
        return FailedPreconditionError(prompt.origin + ": the tokenizer has no " + kVideoPadToken +
                                       " token, which videos need");
      }
      ENGINE_RETURN_IF_ERROR(ExpandImageTokens(pad[0], video_pads, &ids, nullptr, kVideoPadToken)
                                 .WithContext(prompt.origin));
    }
    encoded.push_back(std::move(ids));
  }
  return encoded;
}

}  // namespace engine
