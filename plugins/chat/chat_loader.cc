// The `chat` data loader: conversations from JSON Lines (OpenAI/TRL messages, ShareGPT, alpaca:
// conversation_formats.h), rendered by the model's own chat template (tokenizer_config.json) and
// tokenized whole, with loss only on the assistant's turns, end-of-turn tokens included
// (loss_mask.h).
//
// Each conversation is one example of at most max_length tokens: longer ones are cut at the end
// (TRUNCATE_END; one left without loss tokens is dropped) or left out (DROP), and counted.
// Conversations without an assistant turn are skipped and counted (or an error). Batches are
// padded at the right to their longest row: "input_ids" (pad_id), "labels" (input_ids where
// the token carries loss, -100 elsewhere and on padding) and "attention_mask", all i64 [B, L].
// Right padding keeps examples apart in a causal model: no real token attends to a later
// position, and positions start at 0 in every row. So a padded batch's loss is the token-weighted
// mean of its examples' losses.
//
// With `packing`, a row holds several conversations back to back (next fit, in the split's
// shuffled order, up to max_length tokens): fewer rows, far less padding when conversations are
// short. The attention mask then numbers the row's conversations 1, 2, ... (0 on padding), which
// the decoder reads as "attend within your own example, count positions from its start"
// (transformer/attention_mask.h), and the first token of each conversation carries no label (it
// would be predicted from the one before). A packed batch's loss is still the token-weighted mean
// of its conversations' losses, and its gradients those of the conversations one by one.
//
// The plan line counts the conversations by layout, their tokens (min/median/max), the truncated
// and dropped ones and why, and the share of tokens that carry loss. The baselines are the eval
// perplexity, on loss tokens, of a unigram model counted on the train split's loss tokens, and the
// exact match of always giving the train split's most common answer.
//
// Lines may name images ("images" or "image", chat_images.h): the batches then also carry each
// example's pixels and image grids (engine/image_batch.h), decoded for every batch.
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "batch_indices.h"
#include "chat/tokenizer_config.h"
#include "chat_examples.h"
#include "chat_images.h"
#include "chat_options.pb.h"
#include "data_split.h"
#include "engine/data.h"
#include "engine/format.h"
#include "engine/hash.h"
#include "engine/image_batch.h"
#include "engine/paths.h"
#include "engine/tokenizer.h"
#include "read_file.h"
#include "text/stage_tokenizer.h"

namespace engine::plugins {
namespace {

constexpr int64_t kIgnoreIndex = -100;

struct PackedRows {
  std::vector<std::vector<int64_t>> train, eval;
};

// Next fit: each conversation goes into the current row when it fits in `max_length` tokens,
// otherwise it opens the next row. Without packing, one conversation per row.
std::vector<std::vector<int64_t>> Pack(const ChatExamples& examples,
                                       const std::vector<int64_t>& order, bool packing,
                                       int64_t max_length) {
  std::vector<std::vector<int64_t>> rows;
  int64_t used = max_length;
  for (int64_t example : order) {
    const auto length = static_cast<int64_t>(examples.ids[example].size());
    if (!packing || used + length > max_length) {
      rows.emplace_back();
      used = 0;
    }
    rows.back().push_back(example);
    used += length;
  }
  return rows;
}

// ", packed into 12 rows of at most 1024 tokens (87% filled)" for the train split.
std::string PackingSummary(const ChatExamples& examples, const std::vector<int64_t>& train,
                           size_t rows, int64_t max_length) {
  if (rows == 0) return "";
  int64_t tokens = 0;
  for (int64_t example : train) tokens += static_cast<int64_t>(examples.ids[example].size());
  const double filled =
      static_cast<double>(tokens) / (static_cast<double>(rows) * static_cast<double>(max_length));
  return "; train conversations packed into " + std::to_string(rows) + " rows of at most " +
         std::to_string(max_length) + " tokens (" + FormatFixed(100 * filled, 1) + "% filled)";
}

class ChatDataset : public Dataset {
 public:
  ChatDataset(ChatExamples examples, PackedRows rows, bool packed,
              std::shared_ptr<const ChatImages> images, std::shared_ptr<const ChatImages> videos,
              DataSpec spec, std::string description, std::string identity,
              std::map<std::string, double> baselines)
      : examples_(std::move(examples)),
        packed_(packed),
        images_(std::move(images)),
        videos_(std::move(videos)),
        spec_(std::move(spec)),
        description_(std::move(description)),
        identity_(std::move(identity)),
        baselines_(std::move(baselines)) {
    rows_[0] = std::move(rows.train);
    rows_[1] = std::move(rows.eval);
  }

  const DataSpec& spec() const override { return spec_; }
  int64_t size(Split split) const override { return static_cast<int64_t>(Rows(split).size()); }

  StatusOr<Batch> GetBatch(Split split, const std::vector<int64_t>& indices) const override {
    const std::vector<std::vector<int64_t>>& rows = Rows(split);
    ENGINE_RETURN_IF_ERROR(
        CheckBatchIndices(split, indices, size(split), packed_ ? "packed rows" : "conversations"));
    int64_t length = 1;
    for (int64_t index : indices) length = std::max(length, RowLength(rows[index]));
    const auto n = static_cast<int64_t>(indices.size());
    at::Tensor ids = at::full({n, length}, spec_.pad_id, at::kLong);
    at::Tensor labels = at::full({n, length}, kIgnoreIndex, at::kLong);
    at::Tensor mask = at::full({n, length}, 0, at::kLong);
    int64_t* ids_data = ids.data_ptr<int64_t>();
    int64_t* labels_data = labels.data_ptr<int64_t>();
    int64_t* mask_data = mask.data_ptr<int64_t>();
    for (int64_t b = 0; b < n; ++b) {
      int64_t at = b * length;
      int64_t segment = 1;
      for (int64_t row : rows[indices[b]]) {
        const std::vector<int64_t>& example = examples_.ids[row];
        for (size_t t = 0; t < example.size(); ++t, ++at) {
          ids_data[at] = example[t];
          mask_data[at] = segment;
          if (examples_.loss[row][t] && !(packed_ && t == 0)) labels_data[at] = example[t];
        }
        if (packed_) ++segment;
      }
    }
    Batch batch{{"input_ids", ids}, {"labels", labels}, {"attention_mask", mask}};
    ENGINE_RETURN_IF_ERROR(
        AddPixels(rows, indices, images_.get(), examples_.images, kImageFields, &batch));
    ENGINE_RETURN_IF_ERROR(
        AddPixels(rows, indices, videos_.get(), examples_.videos, kVideoFields, &batch));
    return batch;
  }

  std::string description() const override { return description_; }
  std::string identity() const override { return identity_; }
  std::map<std::string, double> baselines() const override { return baselines_; }
  // Images and videos are decoded and resized for every batch.
  bool cheap_batches() const override { return images_ == nullptr && videos_ == nullptr; }

 private:
  // The pixels of the batch rows' images (videos) into `batch`, as `fields` name them.
  static Status AddPixels(const std::vector<std::vector<int64_t>>& rows,
                          const std::vector<int64_t>& indices, const ChatImages* reader,
                          const std::vector<std::vector<ExampleImage>>& example_visuals,
                          const VisualFields& fields, Batch* batch) {
    if (reader == nullptr) return Status::Ok();
    std::vector<ExampleImages> row_pixels;
    for (int64_t index : indices) {
      std::vector<ExampleImage> visuals;
      for (int64_t row : rows[index]) {
        visuals.insert(visuals.end(), example_visuals[row].begin(), example_visuals[row].end());
      }
      ENGINE_ASSIGN_OR_RETURN(ExampleImages pixels, reader->Pixels(visuals));
      row_pixels.push_back(std::move(pixels));
    }
    PackImages(row_pixels, reader->processor().patch_values(), batch, fields);
    return Status::Ok();
  }

  const std::vector<std::vector<int64_t>>& Rows(Split split) const {
    return rows_[split == Split::kTrain ? 0 : 1];
  }
  int64_t RowLength(const std::vector<int64_t>& row) const {
    int64_t length = 0;
    for (int64_t example : row) length += static_cast<int64_t>(examples_.ids[example].size());
    return length;
  }

  ChatExamples examples_;
  const bool packed_;
  // Null unless some example has images (videos).
  std::shared_ptr<const ChatImages> images_;
  std::shared_ptr<const ChatImages> videos_;
  // Each row's conversations (one each without packing).
  std::vector<std::vector<int64_t>> rows_[2];
  DataSpec spec_;
  std::string description_;
  std::string identity_;
  std::map<std::string, double> baselines_;
};

// Perplexity on the eval examples' loss tokens of add-one-smoothed unigram frequencies of the
// train examples' loss tokens.
double UnigramPerplexity(const ChatExamples& examples, const SplitRows& split, int64_t vocab) {
  std::vector<double> counts(static_cast<size_t>(vocab), 1.0);
  double total = static_cast<double>(vocab);
  for (int64_t row : split.train) {
    for (size_t t = 0; t < examples.ids[row].size(); ++t) {
      if (!examples.loss[row][t]) continue;
      counts[static_cast<size_t>(examples.ids[row][t])] += 1;
      total += 1;
    }
  }
  double nll = 0;
  int64_t n = 0;
  for (int64_t row : split.eval) {
    for (size_t t = 0; t < examples.ids[row].size(); ++t) {
      if (!examples.loss[row][t]) continue;
      nll -= std::log(counts[static_cast<size_t>(examples.ids[row][t])] / total);
      ++n;
    }
  }
  return n > 0 ? std::exp(nll / static_cast<double>(n)) : 0;
}

// The share of eval examples whose answers (their loss tokens) are the train split's most common
// ones: the exact match of a model that always gives that answer.
double MostCommonAnswerMatch(const ChatExamples& examples, const SplitRows& split) {
  auto answer = [&](int64_t row) {
    std::vector<int64_t> tokens;
    for (size_t t = 0; t < examples.ids[row].size(); ++t) {
      if (examples.loss[row][t]) tokens.push_back(examples.ids[row][t]);
    }
    return tokens;
  };
  std::map<std::vector<int64_t>, int64_t> counts;
  for (int64_t row : split.train) ++counts[answer(row)];
  const auto common =
      std::max_element(counts.begin(), counts.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  if (common == counts.end() || split.eval.empty()) return 0;
  int64_t matches = 0;
  for (int64_t row : split.eval) matches += answer(row) == common->first ? 1 : 0;
  return static_cast<double>(matches) / static_cast<double>(split.eval.size());
}

// The tokenizer_config.json with the chat template: the option, or the one beside the tokenizer.
std::filesystem::path ChatConfigPath(const ChatOptions& options, const DataContext& context) {
  if (!options.tokenizer().config().empty()) {
    return ResolvePath(context.base_dir, options.tokenizer().config());
  }
  const std::filesystem::path tokenizer = ResolvePath(context.base_dir, options.tokenizer().path());
  return std::filesystem::is_directory(tokenizer) ? tokenizer : tokenizer.parent_path();
}

// What decides the images' (videos') pixels: the files, the processor's settings, the fps.
std::string ImagesIdentity(const ChatImages& images) {
  const Qwen2VlImageProcessor& p = images.processor();
  std::string settings;
  for (double v : {static_cast<double>(p.min_pixels), static_cast<double>(p.max_pixels),
                   static_cast<double>(p.patch_size), static_cast<double>(p.temporal_patch_size),
                   static_cast<double>(p.merge_size), p.rescale_factor, p.image_mean[0],
                   p.image_mean[1], p.image_mean[2], p.image_std[0], p.image_std[1], p.image_std[2],
                   static_cast<double>(p.do_resize + 2 * p.do_rescale + 4 * p.do_normalize)}) {
    settings += std::to_string(v) + ",";
  }
  if (images.videos()) {
    for (double v :
         {images.fps(), static_cast<double>(p.cap_pixels_per_frame),
          static_cast<double>(p.max_video_tokens), static_cast<double>(p.video_kind),
          static_cast<double>(p.sample_frames), p.sample_fps, static_cast<double>(p.num_frames),
          static_cast<double>(p.min_frames), static_cast<double>(p.max_frames)}) {
      settings += std::to_string(v) + ",";
    }
    return ":videos=" + images.stats().content_hash + ":processor=" + Fnv1a64Hex(settings);
  }
  return ":images=" + images.stats().content_hash + ":processor=" + Fnv1a64Hex(settings);
}

// The single id of `token` in the tokenizer, or an error saying what needs it.
StatusOr<int64_t> PadId(const Tokenizer& tokenizer, const char* token, const std::string& needs) {
  const std::vector<int64_t> pad = tokenizer.Encode(token);
  if (pad.size() != 1) {
    return InvalidArgumentError(std::string("the tokenizer has no ") + token + " token, which " +
                                needs);
  }
  return pad[0];
}

// The directories image and video paths may lead into: the data file's, and the allowed ones.
std::vector<std::filesystem::path> VisualDirs(const ChatOptions& options,
                                              const DataContext& context,
                                              const std::filesystem::path& data_path) {
  std::vector<std::filesystem::path> dirs = {data_path.parent_path()};
  for (const std::string& dir : options.images().allowed_dirs()) {
    dirs.push_back(ResolvePath(context.base_dir, dir));
  }
  return dirs;
}

// The video processor for lines that name videos: `videos.processor`, or the directory of the
// image processor (its video_preprocessor_config.json, or preprocessor_config.json).
StatusOr<std::shared_ptr<ChatImages>> MakeChatVideos(const ChatOptions& options,
                                                     const DataContext& context,
                                                     const Tokenizer& tokenizer,
                                                     const std::filesystem::path& data_path) {
  const ChatVideoOptions& videos = options.videos();
  const std::filesystem::path path =
      videos.processor().empty()
          ? ImageProcessorPath(options.tokenizer(), "", context.base_dir).parent_path()
          : ResolvePath(context.base_dir, videos.processor());
  ENGINE_ASSIGN_OR_RETURN(Qwen2VlImageProcessor processor,
                          Qwen2VlImageProcessor::ReadForVideos(path));
  if (videos.min_pixels() > 0) processor.min_pixels = videos.min_pixels();
  if (videos.max_pixels() > 0) processor.max_pixels = videos.max_pixels();
  if (processor.min_pixels > processor.max_pixels) {
    return InvalidArgumentError("videos: min_pixels " + std::to_string(processor.min_pixels) +
                                " is above max_pixels " + std::to_string(processor.max_pixels));
  }
  if (!(videos.fps() > 0) || videos.fps() > 1000) {
    return InvalidArgumentError("videos.fps must be above 0 and at most 1000, not " +
                                std::to_string(videos.fps()));
  }
  ENGINE_ASSIGN_OR_RETURN(int64_t pad, PadId(tokenizer, kVideoPadToken, "videos need"));
  return std::make_shared<ChatImages>(std::move(processor), pad,
                                      VisualDirs(options, context, data_path), videos.fps());
}

// The image processor for lines that name images: `images.processor`, or the
// preprocessor_config.json beside the tokenizer's config; null when neither exists.
StatusOr<std::shared_ptr<ChatImages>> MakeChatImages(const ChatOptions& options,
                                                     const DataContext& context,
                                                     const Tokenizer& tokenizer,
                                                     const std::filesystem::path& data_path) {
  const bool named = !options.images().processor().empty();
  const std::filesystem::path path =
      ImageProcessorPath(options.tokenizer(), options.images().processor(), context.base_dir);
  if (!named && !std::filesystem::exists(path)) return std::shared_ptr<ChatImages>();
  ENGINE_ASSIGN_OR_RETURN(Qwen2VlImageProcessor processor, Qwen2VlImageProcessor::Read(path));
  if (options.images().min_pixels() > 0) processor.min_pixels = options.images().min_pixels();
  if (options.images().max_pixels() > 0) processor.max_pixels = options.images().max_pixels();
  if (processor.min_pixels > processor.max_pixels) {
    return InvalidArgumentError("images: min_pixels " + std::to_string(processor.min_pixels) +
                                " is above max_pixels " + std::to_string(processor.max_pixels));
  }
  ENGINE_ASSIGN_OR_RETURN(
      int64_t pad, PadId(tokenizer, kImagePadToken,
                         "images need (" + path.string() + " is Qwen2-VL's image processor)"));
  return std::make_shared<ChatImages>(std::move(processor), pad,
                                      VisualDirs(options, context, data_path));
}

class ChatLoader : public DataLoaderPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return ChatOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& message,
                       OptionErrors* errors) const override {
    const auto& options = OptionsAs<ChatOptions>(message);
    if (options.has_path() && options.path().empty()) errors->Add("path", "is empty");
    if (options.tokenizer().kind() != proto::TokenizerOptions::HF_JSON) {
      errors->Add("tokenizer.kind",
                  "must be HF_JSON: conversations need the chat template of a "
                  "Hugging Face tokenizer");
    }
    ValidateTokenizerOptions(options.tokenizer(), "tokenizer.", errors);
    if (options.max_length() < 2) errors->Add("max_length", "must be at least 2");
    CheckEvalFraction(options.eval_fraction(), errors);
  }

  StatusOr<std::unique_ptr<Dataset>> Open(const google::protobuf::Message& message,
                                          const DataContext& context) const override {
    const auto& options = OptionsAs<ChatOptions>(message);
    const std::filesystem::path path = ResolvePath(context.base_dir, options.path());
    ENGINE_ASSIGN_OR_RETURN(std::string text, ReadMaybeCompressed(path));
    ENGINE_ASSIGN_OR_RETURN(auto tokenizer, MakeTokenizer(options.tokenizer(), context.base_dir));
    ENGINE_ASSIGN_OR_RETURN(chat::TokenizerChatConfig config,
                            chat::ReadTokenizerChatConfig(ChatConfigPath(options, context)));
    ENGINE_ASSIGN_OR_RETURN(chat::NamedChatTemplate named, config.Select(options.chat_template(),
                                                                         /*with_tools=*/false));
    ENGINE_ASSIGN_OR_RETURN(chat::ChatTemplate chat_template, config.Load(options.chat_template()));
    ENGINE_ASSIGN_OR_RETURN(std::shared_ptr<ChatImages> images,
                            MakeChatImages(options, context, *tokenizer, path));
    // A directory without a video processor (or with one this engine refuses) is fine until a
    // line names a video: that line's error then says why there is none.
    StatusOr<std::shared_ptr<ChatImages>> videos =
        MakeChatVideos(options, context, *tokenizer, path);
    if (!videos.ok() && options.has_videos()) return videos.status();
    ChatVisuals visuals{images.get(), videos.ok() ? videos->get() : nullptr,
                        videos.ok() ? "" : videos.status().message()};
    ENGINE_ASSIGN_OR_RETURN(
        ChatExamples examples,
        ReadChatExamples(text, path.string(), chat_template, *tokenizer, options, visuals));
    if (images != nullptr && images->stats().images == 0) images.reset();
    std::shared_ptr<ChatImages> video_reader = videos.ok() ? *videos : nullptr;
    if (video_reader != nullptr && video_reader->stats().images == 0) video_reader.reset();
    SplitRows split = ShuffleAndSplit(static_cast<int64_t>(examples.ids.size()), context.seed,
                                      options.eval_fraction());
    if (options.eval_fraction() > 0 && split.eval.empty() && split.train.size() >= 2) {
      split.eval.push_back(split.train.back());
      split.train.pop_back();
    }
    const auto max_length = static_cast<int64_t>(options.max_length());
    PackedRows rows{Pack(examples, split.train, options.packing(), max_length),
                    Pack(examples, split.eval, options.packing(), max_length)};
    DataSpec spec;
    const int64_t vocab = tokenizer->vocab_size();
    spec.fields = {{"input_ids", at::kLong, {-1}, vocab},
                   {"labels", at::kLong, {-1}, 0},  // -100 where no loss: not class ids
                   {"attention_mask", at::kLong, {-1}, 0}};
    if (images != nullptr) {
      spec.fields.push_back(
          {kPixelValuesField, at::kFloat, {-1, images->processor().patch_values()}, 0});
      spec.fields.push_back({kImageGridField, at::kLong, {-1, 3}, 0});
    }
    if (video_reader != nullptr) {
      spec.fields.push_back(
          {kVideoPixelValuesField, at::kFloat, {-1, video_reader->processor().patch_values()}, 0});
      spec.fields.push_back({kVideoGridField, at::kLong, {-1, 3}, 0});
      spec.fields.push_back({kVideoSecondsField, at::kFloat, {-1}, 0});
    }
    spec.pad_id = tokenizer->pad_id();
    spec.eos_id = tokenizer->eos_id();
    std::map<std::string, double> baselines;
    if (!split.eval.empty()) {
      baselines["perplexity"] = UnigramPerplexity(examples, split, vocab);
      baselines["exact_match"] = MostCommonAnswerMatch(examples, split);
    }
    const std::string description =
        examples.stats.Summary(options) + " (" + tokenizer->description() + ", template " +
        chat_template.name() + ") from " + path.string() +
        (images != nullptr ? "; " + images->stats().Summary() : std::string()) +
        (video_reader != nullptr ? "; " + video_reader->stats().Summary() : std::string()) +
        (options.packing() ? PackingSummary(examples, split.train, rows.train.size(), max_length)
                           : std::string());
    const std::string identity =
        "chat:" + Fnv1a64Hex(text) + ":" + tokenizer->identity() +
        ":template=" + Fnv1a64Hex(named.text) +
        ":max_length=" + std::to_string(options.max_length()) +
        ":truncation=" + std::to_string(options.truncation()) +
        ":skip=" + std::to_string(options.skip_without_assistant()) +
        ":eval_fraction=" + std::to_string(options.eval_fraction()) +
        ":max_examples=" + std::to_string(options.max_examples()) +
        ":packing=" + std::to_string(options.packing()) +
        (images != nullptr ? ImagesIdentity(*images) : std::string()) +
        (video_reader != nullptr ? ImagesIdentity(*video_reader) : std::string()) +
        ":seed=" + std::to_string(context.seed);
    return std::unique_ptr<Dataset>(new ChatDataset(
        std::move(examples), std::move(rows), options.packing(), std::move(images),
        std::move(video_reader), std::move(spec), description, identity, std::move(baselines)));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("chat", ENGINE_KIND_DATA_LOADER, "0.1.0",
              "conversations from JSON Lines (messages, ShareGPT, alpaca) rendered by the model's "
              "chat template, with loss on the assistant's turns only",
              engine::plugins::ChatLoader)
