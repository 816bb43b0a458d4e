// The `digits` data loader: scikit-learn's 1,797 8x8 handwritten digits with their labels.
//
// Reads the whole file at Open (it is 57 KB compressed), checks every line, and splits the images
// into train and eval by a shuffle from the stage seed. Batches hold "features" (f32 [B, 64]) and
// "labels" (i64 [B], 10 classes).
#include <ATen/ops/index_select.h>
#include <ATen/ops/tensor.h>

#include <cmath>

#include "batch_indices.h"
#include "data_split.h"
#include "digits_csv.h"
#include "digits_options.pb.h"
#include "engine/data.h"
#include "engine/format.h"
#include "engine/paths.h"

namespace engine::plugins {
namespace {

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
    spec_.fields = {{"features", at::kFloat, {kDigitPixels}, 0},
                    {"labels", at::kLong, {}, kDigitClasses}};
  }

  const DataSpec& spec() const override { return spec_; }
  int64_t size(Split split) const override { return Rows(split).numel(); }

  StatusOr<Batch> GetBatch(Split split, const std::vector<int64_t>& indices) const override {
    const at::Tensor& rows = Rows(split);
    const int64_t n = rows.numel();
    ENGINE_RETURN_IF_ERROR(CheckBatchIndices(split, indices, n, "images"));
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
    CheckEvalFraction(options.eval_fraction(), errors);
  }

  StatusOr<std::unique_ptr<Dataset>> Open(const google::protobuf::Message& message,
                                          const DataContext& context) const override {
    const auto& options = OptionsAs<DigitsOptions>(message);
    const std::filesystem::path path = ResolvePath(context.base_dir, options.path());
    ENGINE_ASSIGN_OR_RETURN(DigitsTable table, ReadDigitsCsv(path));
    const int64_t n = table.labels.numel();
    if (options.normalize()) table.pixels.div_(16.0);
    SplitRows split = ShuffleAndSplit(n, context.seed, options.eval_fraction());

    const std::string description = WithThousands(n) + " images 8x8 (" +
                                    (options.normalize() ? "scaled to 0..1" : "values 0..16") +
                                    ") from " + path.string();
    const std::string identity = "digits:" + table.content_hash + ":n=" + std::to_string(n) +
                                 ":eval_fraction=" + std::to_string(options.eval_fraction()) +
                                 ":normalize=" + std::to_string(options.normalize()) +
                                 ":seed=" + std::to_string(context.seed);
    return std::unique_ptr<Dataset>(
        new DigitsDataset(std::move(table.pixels), std::move(table.labels), std::move(split.train),
                          std::move(split.eval), description, identity));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("digits", ENGINE_KIND_DATA_LOADER, "0.1.0",
              "scikit-learn's 1,797 8x8 handwritten digits with labels, split train/eval by seed",
              engine::plugins::DigitsLoader)
