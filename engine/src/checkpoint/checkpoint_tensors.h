// The model tensors of a checkpoint directory by their names in the model, wherever the checkpoint
// stores them: model.safetensors; for a slim checkpoint, adapter_model.safetensors for the
// tensors it keeps there only (manifest field `adapter_file_tensor`, under PEFT's
// "base_model.model." names), so that each trained tensor is written once; and the ranks' weight
// files of a shard_level 3 stage's checkpoint (checkpoint/checkpoint.h's
// RankFile::kWeights), whose pieces Get() puts together.
//
// Holds the files open (memory-mapped); read-only and usable from any thread once opened. Errors
// name the file.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/tensor_pieces.h"
#include "engine/checkpoint.pb.h"
#include "engine/safetensors.h"
#include "engine/status.h"

namespace engine {

class CheckpointTensors {
 public:
  static StatusOr<CheckpointTensors> Open(const std::filesystem::path& dir,
                                          const proto::CheckpointManifest& manifest);

  // Every tensor, by its name in the model (model.safetensors's first).
  const std::vector<safetensors::TensorInfo>& tensors() const { return tensors_; }
  // Null when there is none of that name.
  const safetensors::TensorInfo* Find(const std::string& name) const;
  StatusOr<at::Tensor> Get(const std::string& name) const;

 private:
  std::shared_ptr<const safetensors::File> model_;
  std::shared_ptr<const safetensors::File> adapters_;  // null when nothing is kept there only
  std::shared_ptr<const TensorPieces> rank_pieces_;    // null without ranks' weight files
  std::vector<safetensors::TensorInfo> tensors_;
  std::map<std::string, size_t> index_;  // name -> tensors_ position
  size_t model_count_ = 0;               // tensors_[0, model_count_) are model.safetensors's
  size_t adapter_end_ = 0;  // then the adapter file's up to here, then the ranks' pieces
};

}  // namespace engine
