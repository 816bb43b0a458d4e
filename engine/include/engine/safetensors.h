// Reading and writing safetensors files (https://github.com/huggingface/safetensors), the weight
// format the rest of the ecosystem reads.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}),
// then the tensors' bytes. Offsets are relative to the end of the header.
//
//   ENGINE_RETURN_IF_ERROR(safetensors::Write(path, {{"w", w}, {"b", b}}, {{"step", "10"}}));
//   ENGINE_ASSIGN_OR_RETURN(auto file, safetensors::File::Open(path));
//   ENGINE_ASSIGN_OR_RETURN(at::Tensor w, file->Get("w"));
//
// Writing is atomic: the file appears complete under its name or not at all (temporary file, fsync,
// rename, fsync of the directory). Reading maps the file; tensors returned by Get are copy-on-write
// views of the mapping that keep it alive, so they stay valid after the File is gone, and writing
// into them never changes the file. Every structural property is checked before any tensor is
// returned: header size, JSON, dtypes, shapes, that offsets lie inside the file, match the shapes,
// and cover the data without gaps or overlaps. A bad file is an error naming the file and the
// tensor, never a crash.
//
// Thread safety: a File is immutable after Open; Get may be called concurrently.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/status.h"

namespace engine::safetensors {

// Headers larger than this are refused as corrupt (the format's own limit).
inline constexpr uint64_t kMaxHeaderBytes = 100 * 1000 * 1000;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
using Metadata = std::map<std::string, std::string>;

// Writes `tensors` (any device, any layout; copied to contiguous CPU memory) and `metadata`
// atomically. Names must be unique and non-empty, and must not be "__metadata__".
Status Write(const std::filesystem::path& path, const NamedTensors& tensors,
             const Metadata& metadata = {});

struct TensorInfo {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offsets in the data section
  uint64_t end = 0;
};

class File {
 public:
  static StatusOr<std::shared_ptr<const File>> Open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  // In the order of their offsets in the file.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const Metadata& metadata() const { return metadata_; }
  const TensorInfo* Find(const std::string& name) const;

  // A CPU tensor viewing the mapped bytes (copied only when misaligned for its dtype).
  StatusOr<at::Tensor> Get(const std::string& name) const;
  // Every tensor, in file order.
  StatusOr<NamedTensors> GetAll() const;
  // Gives the memory of `name`'s bytes back (the whole pages inside them), once they have been
  // copied: the process's resident memory drops, the page cache keeps the file. A view from Get()
  // still reads the file's bytes afterwards, but changes made through it are lost. For loaders
  // that read a large checkpoint tensor by tensor.
  void ReleasePages(const std::string& name) const;

  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

 private:
  File() = default;
  struct Mapping;

  std::filesystem::path path_;
  std::shared_ptr<Mapping> mapping_;
  const uint8_t* data_ = nullptr;  // start of the data section inside the mapping
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  Metadata metadata_;
};

}  // namespace engine::safetensors
