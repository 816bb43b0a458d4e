// Data loader plugins: a dataset with a train and an eval split, read by index.
//
//   class MyLoader : public engine::DataLoaderPlugin {
//     const google::protobuf::Message& default_options() const override;
//     engine::StatusOr<std::unique_ptr<engine::Dataset>> Open(
//         const google::protobuf::Message& options, const engine::DataContext& context) const
//         override;
//   };
//
// The engine opens the dataset at `engine check` time (to print split sizes and steps per epoch)
// and again at `engine run`. Open reads what it needs to know the sizes; it reports a missing or
// malformed file as an error naming the file and, where there is one, the line.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/plugin.h"

namespace engine {

// Named tensors; every tensor's first dimension is the example index.
using Batch = std::map<std::string, at::Tensor>;

enum class Split { kTrain, kEval };
std::string_view SplitName(Split split);

// One field every example has.
struct FieldSpec {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  // Shape of one example; -1 marks a dimension whose size varies.
  std::vector<int64_t> shape;
  // For integer class labels, the number of classes; 0 otherwise.
  int64_t num_classes = 0;
};

// What a dataset's batches contain. Model loaders read it to size their inputs and outputs.
struct DataSpec {
  std::vector<FieldSpec> fields;
  // For token data: the tokenizer's padding and end-of-sequence ids (-1: none), which models need
  // to stop generating.
  int64_t pad_id = -1;
  int64_t eos_id = -1;

  const FieldSpec* Find(std::string_view name) const;
  // "features f32[64], labels i64[] (10 classes)".
  std::string ToString() const;
};

struct DataContext {
  // Relative paths in options resolve against this directory (the pipeline file's).
  std::filesystem::path base_dir;
  // The stage's seed; splits and shuffles derived from it are reproducible.
  uint64_t seed = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual const DataSpec& spec() const = 0;
  virtual int64_t size(Split split) const = 0;
  // The examples `indices` (each in [0, size(split))) stacked along a new first dimension, on the
  // CPU. Safe to call from several threads at once. The engine calls it on a loader thread of its
  // own (unless cheap_batches); beside a step on the CPU, ATen operations there run on that thread
  // alone, as the step's intra-op threads have the cores.
  virtual StatusOr<Batch> GetBatch(Split split, const std::vector<int64_t>& indices) const = 0;
  // One line for the plan, e.g. "1,797 images 8x8 from /data/digits.csv.gz".
  virtual std::string description() const = 0;
  // Changes whenever the examples or their split change (a content hash plus the options that shape
  // the data); part of a stage's fingerprint.
  virtual std::string identity() const = 0;
  // Reference values of evaluation metrics that a model must beat to have learned anything, by
  // metric name (a text loader's unigram perplexity, say). Printed beside the evaluation.
  virtual std::map<std::string, double> baselines() const { return {}; }
  // True when GetBatch only slices tensors already in memory: the engine then reads batches on the
  // training thread, where a background thread would cost more than it saves.
  virtual bool cheap_batches() const { return false; }
};

class DataLoaderPlugin : public Plugin {
 public:
  PluginKind kind() const final { return PluginKind::kDataLoader; }

  virtual StatusOr<std::unique_ptr<Dataset>> Open(const google::protobuf::Message& options,
                                                  const DataContext& context) const = 0;
};

}  // namespace engine
