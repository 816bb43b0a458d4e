// Named tensors stored in pieces: runs of their flattened elements, spread over the files the ranks
// of a sharded stage write (each rank its own parts, so nothing is gathered on one rank), or whole.
//
// A pieces file is a safetensors file whose tensors are named "<name>@<from>": one dimension, the
// elements of `name` from its element `from`; its metadata records each name's whole shape
// ("shape/<name>": "4,3"; "" for a scalar). The pieces of a name, over all the files of a
// checkpoint, must cover its elements exactly once.
//
// Readers take any run of elements (ReadInto) without making the whole tensor, so a rank of another
// world size reads what it owns from wherever it lies; the files stay memory-mapped.
//
// Read-only after Open (any thread). Errors name the file and the tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/safetensors.h"
#include "engine/status.h"

namespace engine {

// What one rank writes: its pieces and the whole shapes of the tensors they belong to.
struct PiecesToWrite {
  safetensors::NamedTensors pieces;  // named by PieceName
  std::map<std::string, std::vector<int64_t>> shapes;
};

// "<name>@<from>".
std::string PieceName(const std::string& name, int64_t from);

// Writes `pieces` (atomically, as safetensors::Write) with their shapes and `metadata`.
Status WritePieces(const std::filesystem::path& path, const PiecesToWrite& pieces,
                   safetensors::Metadata metadata = {});

class TensorPieces {
 public:
  // The pieces of `files` (pieces files); every name's pieces must cover it.
  static StatusOr<TensorPieces> Open(const std::vector<std::filesystem::path>& files);
  // Whole tensors, as one piece each.
  static TensorPieces FromWhole(const safetensors::NamedTensors& tensors);

  // Adds `other`'s names; a name both hold is an error.
  Status Merge(TensorPieces other);

  std::vector<std::string> names() const;
  bool Has(const std::string& name) const { return tensors_.count(name) > 0; }
  // Of a name Has(): its whole shape and dtype.
  const std::vector<int64_t>& shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;

  // Copies `out.numel()` elements of `name` from its element `from` into `out` (contiguous, one
  // dimension, any dtype: converted).
  Status ReadInto(const std::string& name, int64_t from, const at::Tensor& out) const;
  // `name` whole, in its shape, in new CPU memory.
  StatusOr<at::Tensor> Whole(const std::string& name) const;
  // The names `which` picks, whole, in name order; they leave this object.
  StatusOr<safetensors::NamedTensors> TakeWhole(
      const std::function<bool(const std::string&)>& which);

 private:
  struct Piece {
    int64_t from = 0;
    at::Tensor values;  // one dimension
    std::string file;   // for errors; empty for whole tensors
  };
  struct Stored {
    std::vector<int64_t> shape;
    at::ScalarType dtype = at::kFloat;
    std::vector<Piece> pieces;  // by `from`, covering every element once
  };

  std::map<std::string, Stored> tensors_;  // the pieces' views keep their files mapped
};

}  // namespace engine
