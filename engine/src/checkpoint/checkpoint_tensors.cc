#include "checkpoint/checkpoint_tensors.h"

#include "checkpoint/checkpoint.h"

namespace engine {

StatusOr<CheckpointTensors> CheckpointTensors::Open(const std::filesystem::path& dir,
                                                    const proto::CheckpointManifest& manifest) {
  CheckpointTensors result;
  ENGINE_ASSIGN_OR_RETURN(result.model_, safetensors::File::Open(dir / kModelFile));
  result.tensors_ = result.model_->tensors();
  result.model_count_ = result.tensors_.size();
  if (manifest.adapter_file_tensor_size() > 0) {
    const std::filesystem::path path = dir / kAdapterFile;
    ENGINE_ASSIGN_OR_RETURN(result.adapters_, safetensors::File::Open(path));
    for (const std::string& name : manifest.adapter_file_tensor()) {
      const safetensors::TensorInfo* info = result.adapters_->Find(kPeftPrefix + name);
      if (info == nullptr) {
        return DataLossError(path.string() + " lacks '" + kPeftPrefix + name +
                             "', which its manifest says is stored there");
      }
      safetensors::TensorInfo renamed = *info;
      renamed.name = name;
      result.tensors_.push_back(std::move(renamed));
    }
  }
  result.adapter_end_ = result.tensors_.size();
  ENGINE_ASSIGN_OR_RETURN(std::vector<std::string> rank_files,
                          RankFiles(manifest, RankFile::kWeights));
  if (!rank_files.empty()) {
    std::vector<std::filesystem::path> paths;
    for (const std::string& name : rank_files) paths.push_back(dir / name);
    ENGINE_ASSIGN_OR_RETURN(TensorPieces pieces, TensorPieces::Open(paths));
    for (const std::string& name : pieces.names()) {
      safetensors::TensorInfo info;
      info.name = name;
      info.dtype = pieces.dtype(name);
      info.shape = pieces.shape(name);
      result.tensors_.push_back(std::move(info));
    }
    result.rank_pieces_ = std::make_shared<const TensorPieces>(std::move(pieces));
  }
  for (size_t i = 0; i < result.tensors_.size(); ++i) {
    if (!result.index_.emplace(result.tensors_[i].name, i).second) {
      return DataLossError((dir / kModelFile).string() + ": tensor '" + result.tensors_[i].name +
                           "' is stored twice");
    }
  }
  return result;
}

const safetensors::TensorInfo* CheckpointTensors::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

StatusOr<at::Tensor> CheckpointTensors::Get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return model_->Get(name);  // its error names the file and tensor
  if (it->second < model_count_) return model_->Get(name);
  if (it->second < adapter_end_) return adapters_->Get(kPeftPrefix + name);
  return rank_pieces_->Whole(name);
}

}  // namespace engine
