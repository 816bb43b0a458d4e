// The `text` data loader: documents from a text or JSON Lines file, tokenized, packed into
// fixed-length windows for causal language modelling.
//
// Documents (not windows) are shuffled by the stage seed and split train/eval, so no document
// appears in both. Each document becomes bos, its tokens, eos; a split's documents are concatenated
// and cut into windows of sequence_length (the tail shorter than a window is dropped). Batches hold
// "input_ids" and "labels" (both i64 [B, L]; the model predicts labels[t + 1] from position t). The
// baseline is the eval perplexity of a unigram model counted on the train split.
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "batch_indices.h"
#include "data_line.h"
#include "data_split.h"
#include "engine/data.h"
#include "engine/format.h"
#include "engine/hash.h"
#include "engine/paths.h"
#include "engine/tokenizer.h"
#include "engine/utf8.h"
#include "read_file.h"
#include "text_options.pb.h"

namespace engine::plugins {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

std::vector<std::string> SplitTextDocuments(const std::string& text, const std::string& separator) {
  std::vector<std::string> documents;
  std::string current;
  auto flush = [&] {
    while (!current.empty() && (current.back() == '\n' || current.back() == ' '))
      current.pop_back();
    if (!current.empty()) documents.push_back(std::move(current));
    current.clear();
  };
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line = TrimRight(std::string_view(text).substr(start, end - start));
    start = end + 1;
    const bool boundary = separator.empty() ? line.empty() : line == separator;
    if (boundary) {
      flush();
    } else if (!(current.empty() && line.empty())) {
      current.append(line);
      current.push_back('\n');
    }
  }
  flush();
  return documents;
}

StatusOr<std::vector<std::string>> SplitJsonlDocuments(const std::string& text,
                                                       const std::string& field,
                                                       const std::string& path) {
  std::vector<std::string> documents;
  int line_number = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line = TrimRight(std::string_view(text).substr(start, end - start));
    start = end + 1;
    ++line_number;
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(line_number);
    ENGINE_ASSIGN_OR_RETURN(nlohmann::json json, ParseDataLine<nlohmann::json>(line, where));
    auto it = json.find(field);
    if (it == json.end()) return DataLossError(where + ": no field '" + field + "'");
    if (!it->is_string()) return DataLossError(where + ": field '" + field + "' is not a string");
    std::string document = it->get<std::string>();
    if (!document.empty()) documents.push_back(std::move(document));
  }
  return documents;
}

class TextDataset : public Dataset {
 public:
  TextDataset(at::Tensor train, at::Tensor eval, DataSpec spec, std::string description,
              std::string identity, std::map<std::string, double> baselines)
      : description_(std::move(description)),
        identity_(std::move(identity)),
        baselines_(std::move(baselines)),
        spec_(std::move(spec)) {
    windows_[0] = std::move(train);
    windows_[1] = std::move(eval);
  }

  const DataSpec& spec() const override { return spec_; }
  int64_t size(Split split) const override { return Windows(split).size(0); }

  StatusOr<Batch> GetBatch(Split split, const std::vector<int64_t>& indices) const override {
    const at::Tensor& windows = Windows(split);
    ENGINE_RETURN_IF_ERROR(CheckBatchIndices(split, indices, windows.size(0), "windows"));
    at::Tensor ids = windows.index_select(0, at::tensor(indices, at::kLong));
    return Batch{{"input_ids", ids}, {"labels", ids}};
  }

  std::string description() const override { return description_; }
  std::string identity() const override { return identity_; }
  std::map<std::string, double> baselines() const override { return baselines_; }
  bool cheap_batches() const override { return true; }

 private:
  const at::Tensor& Windows(Split split) const { return windows_[split == Split::kTrain ? 0 : 1]; }

  at::Tensor windows_[2];
  std::string description_;
  std::string identity_;
  std::map<std::string, double> baselines_;
  DataSpec spec_;
};

// Concatenates the documents' tokens and cuts them into [windows, length].
at::Tensor Pack(const std::vector<std::vector<int64_t>>& documents, int64_t length) {
  int64_t total = 0;
  for (const auto& d : documents) total += static_cast<int64_t>(d.size());
  const int64_t windows = total / length;
  at::Tensor out = at::empty({windows, length}, at::kLong);
  int64_t* dst = out.data_ptr<int64_t>();
  const int64_t kept = windows * length;
  int64_t written = 0;
  for (const auto& d : documents) {
    if (written == kept) break;
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(d.size()), kept - written);
    std::memcpy(dst + written, d.data(), static_cast<size_t>(n) * sizeof(int64_t));
    written += n;
  }
  return out;
}

// Perplexity on the eval windows' predicted positions (1..L-1) of add-one-smoothed unigram
// frequencies counted on the train windows.
double UnigramPerplexity(const at::Tensor& train, const at::Tensor& eval, int64_t vocab) {
  std::vector<double> counts(static_cast<size_t>(vocab), 1.0);
  double total = static_cast<double>(vocab);
  const int64_t* t = train.data_ptr<int64_t>();
  for (int64_t i = 0; i < train.numel(); ++i) {
    counts[static_cast<size_t>(t[i])] += 1;
    total += 1;
  }
  double nll = 0;
  int64_t n = 0;
  const int64_t length = eval.size(1);
  const int64_t* e = eval.data_ptr<int64_t>();
  for (int64_t w = 0; w < eval.size(0); ++w) {
    for (int64_t p = 1; p < length; ++p) {
      nll -= std::log(counts[static_cast<size_t>(e[w * length + p])] / total);
      ++n;
    }
  }
  return n > 0 ? std::exp(nll / static_cast<double>(n)) : 0;
}

// A file is refused as not text when more than 1 byte in 100 is not UTF-8 or is NUL (a binary file,
// random bytes, another encoding); fewer such bytes are counted in the data's description.
Status CheckLooksLikeText(const std::string& text, const std::filesystem::path& path,
                          size_t* invalid) {
  *invalid = CountInvalidUtf8Bytes(text);
  const size_t nul = static_cast<size_t>(std::count(text.begin(), text.end(), '\0'));
  if ((*invalid + nul) * 100 > text.size()) {
    return DataLossError("'" + path.string() + "' does not look like text: " +
                         WithThousands(static_cast<int64_t>(*invalid)) + " of " +
                         WithThousands(static_cast<int64_t>(text.size())) +
                         " bytes are not UTF-8 and " + WithThousands(static_cast<int64_t>(nul)) +
                         " are NUL; the text loader reads UTF-8 text or JSON Lines");
  }
  return Status::Ok();
}

// Whether `path` is read as JSON Lines: said so, or AUTO and named *.jsonl[.gz].
bool IsJsonl(const TextOptions& options, const std::filesystem::path& path) {
  return options.format() == TextOptions::JSONL ||
         (options.format() == TextOptions::AUTO &&
          (EndsWith(path.string(), ".jsonl") || EndsWith(path.string(), ".jsonl.gz")));
}

// The file's documents, at most max_documents of them; an error when there are none.
StatusOr<std::vector<std::string>> SplitDocuments(const TextOptions& options, bool jsonl,
                                                  const std::string& text,
                                                  const std::filesystem::path& path) {
  std::vector<std::string> documents;
  if (jsonl) {
    ENGINE_ASSIGN_OR_RETURN(documents,
                            SplitJsonlDocuments(text, options.text_field(), path.string()));
  } else {
    documents = SplitTextDocuments(text, options.document_separator());
  }
  if (options.max_documents() > 0 && documents.size() > options.max_documents()) {
    documents.resize(options.max_documents());
  }
  if (documents.empty()) return DataLossError("'" + path.string() + "' holds no documents");
  return documents;
}

// The documents at `rows`, each as bos (if any), its tokens, eos (if any).
std::vector<std::vector<int64_t>> TokenizeDocuments(const Tokenizer& tokenizer,
                                                    const std::vector<std::string>& documents,
                                                    const std::vector<int64_t>& rows) {
  std::vector<std::vector<int64_t>> out;
  out.reserve(rows.size());
  for (int64_t row : rows) {
    std::vector<int64_t> ids;
    if (tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
    auto body = tokenizer.Encode(documents[static_cast<size_t>(row)]);
    ids.insert(ids.end(), body.begin(), body.end());
    if (tokenizer.eos_id() >= 0) ids.push_back(tokenizer.eos_id());
    out.push_back(std::move(ids));
  }
  return out;
}

// Each split that should have windows has at least one.
Status CheckWindows(const TextOptions& options, const std::filesystem::path& path,
                    const SplitRows& split, const at::Tensor& train, const at::Tensor& eval) {
  const std::string length = std::to_string(options.sequence_length());
  if (train.size(0) == 0) {
    return DataLossError("'" + path.string() + "': the train split's " +
                         std::to_string(split.train.size()) + " documents give fewer than " +
                         length + " tokens, not one window; lower sequence_length");
  }
  if (options.eval_fraction() > 0 && eval.size(0) == 0) {
    return DataLossError("'" + path.string() + "': the eval split's " +
                         std::to_string(split.eval.size()) + " documents give fewer than " +
                         length +
                         " tokens, not one window; raise eval_fraction or lower sequence_length");
  }
  return Status::Ok();
}

class TextLoader : public DataLoaderPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return TextOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& message,
                       OptionErrors* errors) const override {
    const auto& options = OptionsAs<TextOptions>(message);
    if (options.has_path() && options.path().empty()) errors->Add("path", "is empty");
    if (options.sequence_length() < 2) {
      errors->Add("sequence_length",
                  "must be at least 2 (got " + std::to_string(options.sequence_length()) + ")");
    }
    CheckEvalFraction(options.eval_fraction(), errors);
    if (options.text_field().empty()) errors->Add("text_field", "is empty");
    ValidateTokenizerOptions(options.tokenizer(), "tokenizer.", errors);
  }

  StatusOr<std::unique_ptr<Dataset>> Open(const google::protobuf::Message& message,
                                          const DataContext& context) const override {
    const auto& options = OptionsAs<TextOptions>(message);
    const std::filesystem::path path = ResolvePath(context.base_dir, options.path());
    ENGINE_ASSIGN_OR_RETURN(std::string text, ReadMaybeCompressed(path));
    size_t invalid_bytes = 0;
    ENGINE_RETURN_IF_ERROR(CheckLooksLikeText(text, path, &invalid_bytes));
    const bool jsonl = IsJsonl(options, path);
    ENGINE_ASSIGN_OR_RETURN(std::vector<std::string> documents,
                            SplitDocuments(options, jsonl, text, path));
    ENGINE_ASSIGN_OR_RETURN(auto tokenizer, MakeTokenizer(options.tokenizer(), context.base_dir));

    const int64_t n = static_cast<int64_t>(documents.size());
    SplitRows split = ShuffleAndSplit(n, context.seed, options.eval_fraction());
    if (options.eval_fraction() > 0 && split.eval.empty() && n >= 2) {
      split.eval.push_back(split.train.back());
      split.train.pop_back();
    }
    const int64_t length = options.sequence_length();
    at::Tensor train = Pack(TokenizeDocuments(*tokenizer, documents, split.train), length);
    at::Tensor eval = Pack(TokenizeDocuments(*tokenizer, documents, split.eval), length);
    ENGINE_RETURN_IF_ERROR(CheckWindows(options, path, split, train, eval));

    DataSpec spec;
    const int64_t vocab = tokenizer->vocab_size();
    spec.fields = {{"input_ids", at::kLong, {length}, vocab},
                   {"labels", at::kLong, {length}, vocab}};
    spec.pad_id = tokenizer->pad_id();
    spec.eos_id = tokenizer->eos_id();
    std::map<std::string, double> baselines;
    if (eval.size(0) > 0) baselines["perplexity"] = UnigramPerplexity(train, eval, vocab);
    const std::string description =
        WithThousands(n) + " documents, " + WithThousands((train.numel() + eval.numel())) +
        " tokens in windows of " + std::to_string(length) + " (" + tokenizer->description() +
        ") from " + path.string() +
        (invalid_bytes == 0
             ? std::string()
             : " (" + WithThousands(static_cast<int64_t>(invalid_bytes)) + " bytes not UTF-8)");
    const std::string identity =
        "text:" + Fnv1a64Hex(text) + ":" + tokenizer->identity() +
        ":jsonl=" + std::to_string(jsonl) + ":field=" + options.text_field() +
        ":sep=" + options.document_separator() + ":length=" + std::to_string(length) +
        ":eval_fraction=" + std::to_string(options.eval_fraction()) +
        ":max_documents=" + std::to_string(options.max_documents()) +
        ":seed=" + std::to_string(context.seed);
    return std::unique_ptr<Dataset>(new TextDataset(std::move(train), std::move(eval),
                                                    std::move(spec), description, identity,
                                                    std::move(baselines)));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("text", ENGINE_KIND_DATA_LOADER, "0.1.0",
              "documents from a text or JSON Lines file, tokenized and packed into windows for "
              "causal language modelling",
              engine::plugins::TextLoader)
