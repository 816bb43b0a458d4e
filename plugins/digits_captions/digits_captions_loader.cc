// The `digits_captions` data loader: the digit images paired with the digit's English name, for
// vision-language models.
//
// Each example is an 8x8 image ("pixel_values", f32 [1, 8, 8]) and the text bos, prompt, answer,
// eos, padded ("input_ids", i64 [L]). "labels" equals input_ids on the answer and its eos and is
// -100 elsewhere, so the loss covers only the answer. For evaluation by generation, "prompt_length"
// (i64 [], the same for every example) says how many text tokens precede the answer and
// "answer_ids" (i64 [A]) holds the answer and eos, padded with -100. The split is the `digits`
// loader's for the same seed.
#include <ATen/ops/full.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/tensor.h>

#include "batch_indices.h"
#include "data_split.h"
#include "digits_captions_options.pb.h"
#include "digits_csv.h"
#include "engine/data.h"
#include "engine/format.h"
#include "engine/paths.h"
#include "engine/tokenizer.h"

namespace engine::plugins {
namespace {

constexpr int64_t kIgnoreIndex = -100;
const char* const kNames[kDigitClasses] = {"zero", "one", "two",   "three", "four",
                                           "five", "six", "seven", "eight", "nine"};

class CaptionsDataset : public Dataset {
 public:
  CaptionsDataset(std::map<std::string, at::Tensor> rows_by_field, SplitRows split, DataSpec spec,
                  std::string description, std::string identity)
      : fields_(std::move(rows_by_field)),
        spec_(std::move(spec)),
        description_(std::move(description)),
        identity_(std::move(identity)) {
    split_rows_[0] = at::tensor(split.train, at::kLong);
    split_rows_[1] = at::tensor(split.eval, at::kLong);
  }

  const DataSpec& spec() const override { return spec_; }
  int64_t size(Split split) const override { return Rows(split).numel(); }

  StatusOr<Batch> GetBatch(Split split, const std::vector<int64_t>& indices) const override {
    const at::Tensor& rows = Rows(split);
    ENGINE_RETURN_IF_ERROR(CheckBatchIndices(split, indices, rows.numel(), "images"));
    const at::Tensor picked = rows.index_select(0, at::tensor(indices, at::kLong));
    Batch batch;
    for (const auto& [name, values] : fields_) batch[name] = values.index_select(0, picked);
    return batch;
  }

  std::string description() const override { return description_; }
  std::string identity() const override { return identity_; }
  bool cheap_batches() const override { return true; }
  std::map<std::string, double> baselines() const override {
    return {{"exact_match", 1.0 / kDigitClasses}};
  }

 private:
  const at::Tensor& Rows(Split split) const { return split_rows_[split == Split::kTrain ? 0 : 1]; }

  std::map<std::string, at::Tensor> fields_;
  at::Tensor split_rows_[2];
  DataSpec spec_;
  std::string description_;
  std::string identity_;
};

// The prompt (after bos) and each digit's answer (ending in eos) as token ids.
struct CaptionTokens {
  std::vector<int64_t> prefix;
  std::vector<std::vector<int64_t>> answers;  // by digit
  int64_t answer_length = 0;                  // the longest answer
  int64_t length() const { return static_cast<int64_t>(prefix.size()) + answer_length; }
};

CaptionTokens EncodeCaptions(const Tokenizer& tokenizer, const std::string& prompt) {
  CaptionTokens tokens;
  if (tokenizer.bos_id() >= 0) tokens.prefix.push_back(tokenizer.bos_id());
  const auto prompt_ids = tokenizer.Encode(prompt);
  tokens.prefix.insert(tokens.prefix.end(), prompt_ids.begin(), prompt_ids.end());
  for (const char* name : kNames) {
    // " seven": SentencePiece and byte-level both read the word as the prompt's continuation.
    auto ids = tokenizer.Encode(std::string(prompt.empty() ? "" : " ") + name);
    ids.push_back(tokenizer.eos_id());
    tokens.answer_length = std::max(tokens.answer_length, static_cast<int64_t>(ids.size()));
    tokens.answers.push_back(std::move(ids));
  }
  return tokens;
}

// Each image's fields: its pixels, the prompt followed by its digit's answer (padded), the answer
// alone as the labels and as answer_ids.
std::map<std::string, at::Tensor> CaptionFields(const DigitsTable& table,
                                                const CaptionTokens& tokens, int64_t pad_id) {
  const int64_t n = table.labels.numel();
  const int64_t prompt_length = static_cast<int64_t>(tokens.prefix.size());
  at::Tensor input_ids = at::full({n, tokens.length()}, pad_id, at::kLong);
  at::Tensor labels = at::full({n, tokens.length()}, kIgnoreIndex, at::kLong);
  at::Tensor answer_ids = at::full({n, tokens.answer_length}, kIgnoreIndex, at::kLong);
  auto ids = input_ids.accessor<int64_t, 2>();
  auto lab = labels.accessor<int64_t, 2>();
  auto ans = answer_ids.accessor<int64_t, 2>();
  auto digit = table.labels.accessor<int64_t, 1>();
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t i = 0; i < prompt_length; ++i) ids[row][i] = tokens.prefix[static_cast<size_t>(i)];
    const auto& answer = tokens.answers[static_cast<size_t>(digit[row])];
    for (size_t i = 0; i < answer.size(); ++i) {
      ids[row][prompt_length + static_cast<int64_t>(i)] = answer[i];
      lab[row][prompt_length + static_cast<int64_t>(i)] = answer[i];
      ans[row][static_cast<int64_t>(i)] = answer[i];
    }
  }
  return {{"pixel_values", table.pixels.reshape({n, 1, 8, 8})},
          {"input_ids", input_ids},
          {"labels", labels},
          {"answer_ids", answer_ids},
          {"prompt_length", at::full({n}, prompt_length, at::kLong)},
          {"digit", table.labels}};
}

DataSpec CaptionSpec(const CaptionTokens& tokens, const Tokenizer& tokenizer) {
  DataSpec spec;
  const int64_t length = tokens.length();
  spec.fields = {
      {"pixel_values", at::kFloat, {1, 8, 8}, 0},
      {"input_ids", at::kLong, {length}, tokenizer.vocab_size()},
      // labels and answer_ids hold token ids or -100 (not predicted): targets, not class ids.
      {"labels", at::kLong, {length}, 0},
      {"answer_ids", at::kLong, {tokens.answer_length}, 0},
      {"prompt_length", at::kLong, {}, 0},
      {"digit", at::kLong, {}, kDigitClasses}};
  spec.pad_id = tokenizer.pad_id();
  spec.eos_id = tokenizer.eos_id();
  return spec;
}

class DigitsCaptionsLoader : public DataLoaderPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return DigitsCaptionsOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& message,
                       OptionErrors* errors) const override {
    const auto& options = OptionsAs<DigitsCaptionsOptions>(message);
    if (options.has_path() && options.path().empty()) errors->Add("path", "is empty");
    CheckEvalFraction(options.eval_fraction(), errors);
    ValidateTokenizerOptions(options.tokenizer(), "tokenizer.", errors);
  }

  StatusOr<std::unique_ptr<Dataset>> Open(const google::protobuf::Message& message,
                                          const DataContext& context) const override {
    const auto& options = OptionsAs<DigitsCaptionsOptions>(message);
    const std::filesystem::path path = ResolvePath(context.base_dir, options.path());
    ENGINE_ASSIGN_OR_RETURN(DigitsTable table, ReadDigitsCsv(path));
    ENGINE_ASSIGN_OR_RETURN(auto tokenizer, MakeTokenizer(options.tokenizer(), context.base_dir));
    if (tokenizer->eos_id() < 0 || tokenizer->pad_id() < 0) {
      return InvalidArgumentError("the tokenizer (" + tokenizer->description() +
                                  ") needs eos and pad ids to mark where answers end");
    }
    const int64_t n = table.labels.numel();
    if (options.normalize()) table.pixels.div_(16.0);
    const CaptionTokens tokens = EncodeCaptions(*tokenizer, options.prompt());
    std::map<std::string, at::Tensor> fields = CaptionFields(table, tokens, tokenizer->pad_id());
    SplitRows split = ShuffleAndSplit(n, context.seed, options.eval_fraction());
    const std::string description = WithThousands(n) + " images 8x8 with captions '" +
                                    options.prompt() + " seven' (" + tokenizer->description() +
                                    ", " + std::to_string(tokens.length()) + " tokens) from " +
                                    path.string();
    const std::string identity = "digits_captions:" + table.content_hash + ":" +
                                 tokenizer->identity() + ":prompt=" + options.prompt() +
                                 ":eval_fraction=" + std::to_string(options.eval_fraction()) +
                                 ":normalize=" + std::to_string(options.normalize()) +
                                 ":seed=" + std::to_string(context.seed);
    return std::unique_ptr<Dataset>(new CaptionsDataset(std::move(fields), std::move(split),
                                                        CaptionSpec(tokens, *tokenizer),
                                                        description, identity));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("digits_captions", ENGINE_KIND_DATA_LOADER, "0.1.0",
              "the 8x8 digit images with their names as captions ('digit: seven'), the loss on the "
              "answer only",
              engine::plugins::DigitsCaptionsLoader)
