// The `digits` data loader: scikit-learn's 1,797 8x8 handwritten digits with their labels.
//
// Reads the whole file at Open (it is 57 KB compressed), checks every line, and splits the images
// into train and eval by a shuffle from the stage seed. Batches hold "features" (f32 [B, 64]) and
// "labels" (i64 [B], 10 classes).
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/tensor.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <random>

#include "digits_options.pb.h"
#include "engine/data.h"
#include "engine/format.h"
#include "engine/hash.h"

namespace engine::plugins {
namespace {

constexpr int kPixels = 64;
constexpr int kClasses = 10;

// Reads a plain or gzip-compressed file (zlib reads both).
StatusOr<std::string> ReadMaybeCompressed(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return InvalidArgumentError("'" + path.string() + "' is a directory, not the digits file");
  }
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return NotFoundError("cannot open '" + path.string() +
                         "': " + (errno ? std::strerror(errno) : "unknown error"));
  }
  std::string content;
  char buffer[1 << 16];
  int n;
  while ((n = gzread(file, buffer, sizeof(buffer))) > 0) content.append(buffer, n);
  int error_code = Z_OK;
  const char* error_text = gzerror(file, &error_code);
  const std::string message = error_text != nullptr ? error_text : "";
  gzclose(file);
  if (n < 0 || (error_code != Z_OK && error_code != Z_STREAM_END)) {
    return DataLossError("cannot read '" + path.string() + "'" +
                         (message.empty() ? std::string() : ": " + message) +
                         " (is the file truncated?)");
  }
  return content;
}

class DigitsDataset : public Dataset {
 public:
  DigitsDataset(at::Tensor features, at::Tensor labels, std::vector<int64_t> train,
                std::vector<int64_t> eval, std::string description, std::string identity)
      : features_(std::move(features)),
        labels_(std::move(labels)),
        description_(std::move(description)),
        identity_(std::move(identity)) {
    split_rows_[0] = at::tensor(train, at::kLong);
    split_rows_[1] = at::tensor(eval, at::kLong);
    spec_.fields = {{"features", at::kFloat, {kPixels}, 0}, {"labels", at::kLong, {}, kClasses}};
  }

  const DataSpec& spec() const override { return spec_; }
  int64_t size(Split split) const override { return Rows(split).numel(); }

  StatusOr<Batch> GetBatch(Split split, const std::vector<int64_t>& indices) const override {
    const at::Tensor& rows = Rows(split);
    const int64_t n = rows.numel();
    for (int64_t i : indices) {
      if (i < 0 || i >= n) {
        return InvalidArgumentError("example " + std::to_string(i) + " is outside the " +
                                    std::string(SplitName(split)) + " split (" + std::to_string(n) +
                                    " examples)");
      }
    }
    at::Tensor picked = rows.index_select(0, at::tensor(indices, at::kLong));
    return Batch{{"features", features_.index_select(0, picked)},
                 {"labels", labels_.index_select(0, picked)}};
  }

  std::string description() const override { return description_; }
  std::string identity() const override { return identity_; }
  bool cheap_batches() const override { return true; }

 private:
  const at::Tensor& Rows(Split split) const { return split_rows_[split == Split::kTrain ? 0 : 1]; }

  at::Tensor features_;
  at::Tensor labels_;
  at::Tensor split_rows_[2];
  DataSpec spec_;
  std::string description_;
  std::string identity_;
};

class DigitsLoader : public DataLoaderPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return DigitsOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& message,
                       OptionErrors* errors) const override {
    const auto& options = OptionsAs<DigitsOptions>(message);
    if (options.has_path() && options.path().empty()) errors->Add("path", "is empty");
    if (!(options.eval_fraction() >= 0 && options.eval_fraction() < 1)) {
      errors->Add("eval_fraction",
                  "must be in [0, 1) (got " + FormatNumber(options.eval_fraction()) + ")");
    }
  }

  StatusOr<std::unique_ptr<Dataset>> Open(const google::protobuf::Message& message,
                                          const DataContext& context) const override {
    const auto& options = OptionsAs<DigitsOptions>(message);
    std::filesystem::path path(options.path());
    if (path.is_relative()) path = (context.base_dir / path).lexically_normal();
    ENGINE_ASSIGN_OR_RETURN(std::string text, ReadMaybeCompressed(path));

    std::vector<float> pixels;
    std::vector<int64_t> labels;
    int line_number = 0;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string_view line(text.data() + start, end - start);
      start = end + 1;
      ++line_number;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      ENGINE_RETURN_IF_ERROR(ParseLine(line, path, line_number, &pixels, &labels));
    }
    const int64_t n = static_cast<int64_t>(labels.size());
    if (n == 0) return DataLossError("'" + path.string() + "' holds no images");

    at::Tensor features = at::empty({n, kPixels}, at::kFloat);
    std::memcpy(features.data_ptr<float>(), pixels.data(), pixels.size() * sizeof(float));
    if (options.normalize()) features.div_(16.0);
    at::Tensor label_tensor = at::empty({n}, at::kLong);
    std::memcpy(label_tensor.data_ptr<int64_t>(), labels.data(), labels.size() * sizeof(int64_t));

    // A deterministic shuffle by the stage seed; the first share is held out for evaluation.
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    std::mt19937_64 rng(context.seed ^ 0xD161D5ULL);
    for (int64_t i = n - 1; i > 0; --i) {
      std::swap(order[i], order[static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1))]);
    }
    const int64_t eval_count =
        static_cast<int64_t>(std::llround(options.eval_fraction() * static_cast<double>(n)));
    std::vector<int64_t> eval(order.begin(), order.begin() + eval_count);
    std::vector<int64_t> train(order.begin() + eval_count, order.end());

    const std::string description = WithThousands(n) + " images 8x8 (" +
                                    (options.normalize() ? "scaled to 0..1" : "values 0..16") +
                                    ") from " + path.string();
    const std::string identity = "digits:" + Fnv1a64Hex(text) + ":n=" + std::to_string(n) +
                                 ":eval_fraction=" + std::to_string(options.eval_fraction()) +
                                 ":normalize=" + std::to_string(options.normalize()) +
                                 ":seed=" + std::to_string(context.seed);
    return std::unique_ptr<Dataset>(new DigitsDataset(std::move(features), std::move(label_tensor),
                                                      std::move(train), std::move(eval),
                                                      description, identity));
  }

 private:
  static Status ParseLine(std::string_view line, const std::filesystem::path& path, int line_number,
                          std::vector<float>* pixels, std::vector<int64_t>* labels) {
    const std::string where = path.string() + ":" + std::to_string(line_number);
    int column = 0;
    size_t start = 0;
    while (start <= line.size()) {
      size_t end = line.find(',', start);
      if (end == std::string_view::npos) end = line.size();
      std::string_view field = line.substr(start, end - start);
      start = end + 1;
      ++column;
      if (column > kPixels + 1) {
        return DataLossError(where + ": more than " + std::to_string(kPixels + 1) +
                             " values (64 pixels and a label expected)");
      }
      int value = 0;
      bool ok = !field.empty() && field.size() <= 3;
      for (char c : field) {
        if (c < '0' || c > '9') ok = false;
        value = value * 10 + (c - '0');
      }
      if (!ok) {
        return DataLossError(where + ": value " + std::to_string(column) + " is '" +
                             std::string(field) + "', not a small non-negative integer");
      }
      if (column <= kPixels) {
        if (value > 16) {
          return DataLossError(where + ": pixel " + std::to_string(column) + " is " +
                               std::to_string(value) + ", outside 0..16");
        }
        pixels->push_back(static_cast<float>(value));
      } else {
        if (value >= kClasses) {
          return DataLossError(where + ": label " + std::to_string(value) + " is outside 0..9");
        }
        labels->push_back(value);
      }
      if (end == line.size()) break;
    }
    if (column != kPixels + 1) {
      return DataLossError(where + ": " + std::to_string(column) +
                           " values; 65 expected (64 pixels and a label)");
    }
    return Status::Ok();
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("digits", ENGINE_KIND_DATA_LOADER, "0.1.0",
              "scikit-learn's 1,797 8x8 handwritten digits with labels, split train/eval by seed",
              engine::plugins::DigitsLoader)
