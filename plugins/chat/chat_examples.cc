#include "chat_examples.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>

#include "conversation_formats.h"
#include "engine/format.h"
#include "loss_mask.h"

namespace engine::plugins {
namespace {

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

// Applies max_length: true when the example stays (possibly truncated). Image and video tokens
// are never cut: an example whose images or videos reach beyond max_length is dropped.
bool FitLength(const ChatOptions& options, const std::vector<int64_t>& pad_ids,
               TokenizedConversation* example, ChatStats* stats) {
  const size_t max_length = options.max_length();
  if (example->ids.size() <= max_length) return true;
  if (options.truncation() == ChatOptions::DROP) {
    ++stats->dropped_too_long;
    return false;
  }
  const auto cut = example->ids.begin() + static_cast<std::ptrdiff_t>(max_length);
  for (int64_t pad_id : pad_ids) {
    if (std::find(cut, example->ids.end(), pad_id) != example->ids.end()) {
      ++stats->dropped_image_cut;
      return false;
    }
  }
  example->ids.resize(max_length);
  example->loss.resize(max_length);
  if (std::find(example->loss.begin(), example->loss.end(), 1) == example->loss.end()) {
    ++stats->dropped_no_loss_left;
    return false;
  }
  ++stats->truncated;
  return true;
}

// How many times `pad` (one added token) occurs in a rendered conversation.
size_t RenderedPads(const chat::RenderedConversation& rendered, const std::string& pad) {
  size_t pads = 0;
  for (size_t at = rendered.text.find(pad); at != std::string::npos;
       at = rendered.text.find(pad, at + 1)) {
    ++pads;
  }
  return pads;
}

// One kind of visual input of a line: what the line names and where its reader puts them.
struct LineVisuals {
  ChatImages* reader;  // null: none configured
  size_t named;        // images (videos) the line names
  const char* pad;     // their pad token's text
  std::vector<ExampleImage>* read;
  bool read_already;  // `read` holds them (Qwen3-VL's videos, read before rendering)
  // The pads the rendered text must hold: one per image (video), or per temporal patch.
  size_t Pads() const { return read_already ? reader->PadCounts(*read).size() : named; }
};

// A rendered conversation's tokens with each image's and video's tokens expanded, and them read
// into `kinds`' vectors; nullopt when one would start past max_length (counted in `stats`).
StatusOr<std::optional<TokenizedConversation>> TokenizeExample(
    const chat::RenderedConversation& rendered, const ParsedConversation& parsed,
    const Tokenizer& tokenizer, const ChatOptions& options, const std::string& where,
    const std::vector<LineVisuals>& kinds, ChatStats* stats) {
  // Tokens past max_length are never kept, so the text past them is not encoded: a line of
  // megabytes costs what max_length tokens cost. The few tokens beyond max_length keep the last
  // kept token's character whole in the decoding the loss mask is found with.
  const size_t encoded_at_most = static_cast<size_t>(options.max_length()) + 8;
  // A text whose pads are not one per image (a template that drops images, a pad written in a
  // message) is an error, counted on the whole text.
  size_t tokens = encoded_at_most;
  for (const LineVisuals& kind : kinds) {
    if (kind.named > 0 && RenderedPads(rendered, kind.pad) != kind.Pads()) {
      tokens = std::numeric_limits<size_t>::max();
    }
  }
  StatusOr<TokenizedConversation> example = TokenizeForTraining(rendered, tokenizer, tokens);
  if (!example.ok()) return example.status().WithContext(where);
  for (const LineVisuals& kind : kinds) {
    if (kind.named == 0) continue;
    if (!kind.read_already) {
      ENGINE_ASSIGN_OR_RETURN(*kind.read, kind.reader->videos()
                                              ? kind.reader->CheckVideos(parsed.videos, where)
                                              : kind.reader->Check(parsed.images, where));
    }
    if (tokens == encoded_at_most && example->ids.size() >= encoded_at_most &&
        std::count(example->ids.begin(), example->ids.end(), kind.reader->pad_id()) <
            static_cast<std::ptrdiff_t>(kind.Pads())) {
      // Encoding stopped before a pad, which would land past max_length: FitLength's drop.
      ++(options.truncation() == ChatOptions::DROP ? stats->dropped_too_long
                                                   : stats->dropped_image_cut);
      return std::optional<TokenizedConversation>();
    }
  }
  for (const LineVisuals& kind : kinds) {
    if (kind.named == 0) continue;
    ENGINE_RETURN_IF_ERROR(kind.reader->ExpandImageTokens(*kind.read, where, &*example));
  }
  return std::optional<TokenizedConversation>(std::move(*example));
}

// The error for a line whose placeholders do not match what it names, or that names what no
// processor reads.
Status CheckNamed(const std::string& where, int64_t placeholders, size_t named,
                  const char* placeholder, const char* noun, const ChatImages* reader,
                  const std::string& how_to_configure) {
  if (placeholders != static_cast<int64_t>(named)) {
    return DataLossError(where + ": " + std::to_string(placeholders) + " " + placeholder +
                         " placeholder(s) in the messages for " + std::to_string(named) + " " +
                         noun + "(s)");
  }
  if (named > 0 && reader == nullptr) {
    return DataLossError(where + ": the line names " + noun + "s, but there is no " + noun +
                         " processor: " + how_to_configure);
  }
  return Status::Ok();
}

// One line's example into `out`, or a reason it is left out (counted in the stats).
Status AddLine(std::string_view line, const std::string& where,
               const chat::ChatTemplate& chat_template, const Tokenizer& tokenizer,
               const ChatOptions& options, const ChatVisuals& visuals, ChatExamples* out) {
  ENGINE_ASSIGN_OR_RETURN(ParsedConversation parsed, ParseConversationLine(line, where));
  // Qwen3-VL's text shows each temporal patch's time: its videos are read (frames sampled) first.
  std::vector<ExampleImage> example_images, example_videos;
  std::vector<std::string> video_texts;
  const bool videos_first =
      visuals.videos != nullptr && visuals.videos->timestamps_in_text() && !parsed.videos.empty();
  if (videos_first) {
    ENGINE_ASSIGN_OR_RETURN(example_videos, visuals.videos->CheckVideos(parsed.videos, where));
    for (const ExampleImage& video : example_videos) {
      video_texts.push_back(Qwen3VideoText(video.timestamps));
    }
  }
  ENGINE_RETURN_IF_ERROR(CheckNamed(
      where, MarkImagePlaceholders(&parsed.messages), parsed.images.size(), kImagePlaceholder,
      "image", visuals.images,
      "set `images { processor: \"preprocessor_config.json\" }` (Qwen2-VL's), or put it beside "
      "the tokenizer"));
  ENGINE_RETURN_IF_ERROR(CheckNamed(
      where, MarkVideoPlaceholders(&parsed.messages, video_texts), parsed.videos.size(),
      kVideoPlaceholder, "video", visuals.videos,
      visuals.videos_unavailable.empty()
          ? "put video_preprocessor_config.json (or preprocessor_config.json) beside the "
            "tokenizer, or name it in `videos { processor: ... }`"
          : visuals.videos_unavailable));
  if (!HasAssistantTurn(parsed.messages)) {
    if (!options.skip_without_assistant()) {
      return DataLossError(where +
                           ": the conversation has no assistant turn to learn from "
                           "(skip_without_assistant: true skips such lines)");
    }
    ++out->stats.skipped_no_assistant;
    return Status::Ok();
  }
  StatusOr<chat::RenderedConversation> rendered = chat_template.RenderForTraining(parsed.messages);
  if (!rendered.ok()) return rendered.status().WithContext(where);
  const std::vector<LineVisuals> kinds = {
      {visuals.images, parsed.images.size(), kImagePadToken, &example_images, false},
      {visuals.videos, parsed.videos.size(), kVideoPadToken, &example_videos, videos_first}};
  ENGINE_ASSIGN_OR_RETURN(
      std::optional<TokenizedConversation> example,
      TokenizeExample(*rendered, parsed, tokenizer, options, where, kinds, &out->stats));
  if (!example) return Status::Ok();
  std::vector<int64_t> pad_ids;
  for (const ChatImages* reader : {visuals.images, visuals.videos}) {
    if (reader != nullptr) pad_ids.push_back(reader->pad_id());
  }
  if (!FitLength(options, pad_ids, &*example, &out->stats)) return Status::Ok();
  ++out->stats.by_format[std::string(ConversationFormatName(parsed.format))];
  out->stats.lengths.push_back(static_cast<int64_t>(example->ids.size()));
  out->stats.tokens += static_cast<int64_t>(example->ids.size());
  out->stats.loss_tokens += std::count(example->loss.begin(), example->loss.end(), 1);
  out->ids.push_back(std::move(example->ids));
  out->loss.push_back(std::move(example->loss));
  out->images.push_back(std::move(example_images));
  out->videos.push_back(std::move(example_videos));
  return Status::Ok();
}

}  // namespace

std::string ChatStats::Summary(const ChatOptions& options) const {
  std::string out = WithThousands(static_cast<int64_t>(lengths.size())) + " conversations (";
  bool first = true;
  for (const auto& [format, count] : by_format) {
    out += (first ? "" : ", ") + format + " " + WithThousands(count);
    first = false;
  }
  out += ")";
  if (!lengths.empty()) {
    std::vector<int64_t> sorted = lengths;
    std::sort(sorted.begin(), sorted.end());
    out += "; tokens min/median/max " + std::to_string(sorted.front()) + "/" +
           std::to_string(sorted[sorted.size() / 2]) + "/" + std::to_string(sorted.back());
  }
  const std::string max_length = std::to_string(options.max_length());
  if (truncated > 0)
    out += "; " + WithThousands(truncated) + " truncated to max_length " + max_length;
  std::vector<std::string> dropped;
  if (dropped_too_long > 0) {
    dropped.push_back(WithThousands(dropped_too_long) + " longer than max_length " + max_length);
  }
  if (dropped_no_loss_left > 0) {
    dropped.push_back(WithThousands(dropped_no_loss_left) +
                      " with no assistant token within max_length " + max_length);
  }
  if (skipped_no_assistant > 0) {
    dropped.push_back(WithThousands(skipped_no_assistant) + " without an assistant turn");
  }
  if (dropped_image_cut > 0) {
    dropped.push_back(WithThousands(dropped_image_cut) +
                      " with image or video tokens beyond max_length " + max_length);
  }
  for (size_t i = 0; i < dropped.size(); ++i) out += (i == 0 ? "; dropped: " : ", ") + dropped[i];
  char share[64];
  std::snprintf(
      share, sizeof(share), "; %.1f%% of tokens carry loss",
      tokens > 0 ? 100.0 * static_cast<double>(loss_tokens) / static_cast<double>(tokens) : 0.0);
  return out + share;
}

StatusOr<ChatExamples> ReadChatExamples(const std::string& text, const std::string& origin,
                                        const chat::ChatTemplate& chat_template,
                                        const Tokenizer& tokenizer, const ChatOptions& options,
                                        const ChatVisuals& visuals) {
  ChatExamples examples;
  int line_number = 0;
  int64_t lines = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view line = TrimRight(std::string_view(text).substr(start, end - start));
    start = end + 1;
    ++line_number;
    if (line.empty()) continue;
    if (options.max_examples() > 0 && lines == options.max_examples()) break;
    ++lines;
    ENGINE_RETURN_IF_ERROR(AddLine(line, origin + ":" + std::to_string(line_number), chat_template,
                                   tokenizer, options, visuals, &examples));
  }
  if (examples.ids.empty()) {
    return DataLossError("'" + origin + "' gives no examples: " + examples.stats.Summary(options));
  }
  return examples;
}

}  // namespace engine::plugins
