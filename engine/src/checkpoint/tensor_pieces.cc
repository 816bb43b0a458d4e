#include "checkpoint/tensor_pieces.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <charconv>
#include <utility>

namespace engine {
namespace {

constexpr const char* kShapeKey = "shape/";

std::string JoinShape(const std::vector<int64_t>& shape) {
  std::string out;
  for (size_t d = 0; d < shape.size(); ++d) out += (d > 0 ? "," : "") + std::to_string(shape[d]);
  return out;
}

bool ParseInt(std::string_view text, int64_t* value) {
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return error == std::errc() && end == text.data() + text.size() && *value >= 0;
}

bool ParseShape(const std::string& text, std::vector<int64_t>* shape) {
  shape->clear();
  if (text.empty()) return true;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    int64_t d = 0;
    if (!ParseInt(std::string_view(text).substr(begin, comma - begin), &d)) return false;
    shape->push_back(d);
    if (comma == std::string::npos) return true;
    begin = comma + 1;
  }
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

std::string PieceName(const std::string& name, int64_t from) {
  return name + "@" + std::to_string(from);
}

Status WritePieces(const std::filesystem::path& path, const PiecesToWrite& pieces,
                   safetensors::Metadata metadata) {
  for (const auto& [name, shape] : pieces.shapes) metadata[kShapeKey + name] = JoinShape(shape);
  return safetensors::Write(path, pieces.pieces, metadata);
}

StatusOr<TensorPieces> TensorPieces::Open(const std::vector<std::filesystem::path>& files) {
  TensorPieces result;
  for (const std::filesystem::path& path : files) {
    ENGINE_ASSIGN_OR_RETURN(std::shared_ptr<const safetensors::File> file,
                            safetensors::File::Open(path));
    for (const safetensors::TensorInfo& info : file->tensors()) {
      const size_t at = info.name.rfind('@');
      int64_t from = 0;
      if (at == std::string::npos || info.shape.size() != 1 ||
          !ParseInt(std::string_view(info.name).substr(at + 1), &from)) {
        return DataLossError(path.string() + ": tensor '" + info.name +
                             "' is not a piece (\"<name>@<first element>\", one dimension)");
      }
      const std::string name = info.name.substr(0, at);
      auto shape = file->metadata().find(kShapeKey + name);
      std::vector<int64_t> whole;
      if (shape == file->metadata().end() || !ParseShape(shape->second, &whole)) {
        return DataLossError(path.string() + ": the shape of '" + name +
                             "' is missing from its metadata or malformed");
      }
      auto [it, fresh] = result.tensors_.try_emplace(name);
      Stored& stored = it->second;
      if (fresh) {
        stored.shape = whole;
        stored.dtype = info.dtype;
      } else if (stored.shape != whole || stored.dtype != info.dtype) {
        return DataLossError(path.string() + ": piece '" + info.name +
                             "' has another dtype or whole shape than the other pieces of '" +
                             name + "'");
      }
      ENGINE_ASSIGN_OR_RETURN(at::Tensor values, file->Get(info.name));
      stored.pieces.push_back({from, std::move(values), path.string()});
    }
  }
  // Every name covered once: pieces end to end from element 0 to the last.
  for (auto& [name, stored] : result.tensors_) {
    std::sort(stored.pieces.begin(), stored.pieces.end(),
              [](const Piece& a, const Piece& b) { return a.from < b.from; });
    int64_t next = 0;
    for (const Piece& piece : stored.pieces) {
      if (piece.from != next) {
        return DataLossError(piece.file + ": piece '" + PieceName(name, piece.from) +
                             (piece.from < next ? "' overlaps another piece"
                                                : "' leaves elements " + std::to_string(next) +
                                                      " to " + std::to_string(piece.from - 1) +
                                                      " of '" + name + "' in no file"));
      }
      next += piece.values.numel();
    }
    if (next != Elements(stored.shape)) {
      return DataLossError(stored.pieces.back().file + ": the pieces of '" + name + "' hold " +
                           std::to_string(next) + " of its " +
                           std::to_string(Elements(stored.shape)) + " elements");
    }
  }
  return result;
}

TensorPieces TensorPieces::FromWhole(const safetensors::NamedTensors& tensors) {
  TensorPieces result;
  for (const auto& [name, tensor] : tensors) {
    Stored& stored = result.tensors_[name];
    stored.shape = tensor.sizes().vec();
    stored.dtype = tensor.scalar_type();
    stored.pieces = {{0, tensor.reshape({-1}), ""}};
  }
  return result;
}

Status TensorPieces::Merge(TensorPieces other) {
  for (auto& [name, stored] : other.tensors_) {
    if (!tensors_.emplace(name, std::move(stored)).second) {
      return DataLossError("tensor '" + name + "' is stored twice");
    }
  }
  return Status::Ok();
}

std::vector<std::string> TensorPieces::names() const {
  std::vector<std::string> out;
  for (const auto& [name, stored] : tensors_) out.push_back(name);
  return out;
}

const std::vector<int64_t>& TensorPieces::shape(const std::string& name) const {
  return tensors_.at(name).shape;
}

at::ScalarType TensorPieces::dtype(const std::string& name) const {
  return tensors_.at(name).dtype;
}

Status TensorPieces::ReadInto(const std::string& name, int64_t from, const at::Tensor& out) const {
  auto it = tensors_.find(name);
  const int64_t end = from + out.numel();
  if (it == tensors_.end() || from < 0 || end > Elements(it->second.shape)) {
    return InternalError("elements " + std::to_string(from) + " to " + std::to_string(end) +
                         " of '" + name + "' are not stored");
  }
  for (const Piece& piece : it->second.pieces) {
    const int64_t begin = std::max(from, piece.from);
    const int64_t stop = std::min(end, piece.from + piece.values.numel());
    if (begin >= stop) continue;
    out.narrow(0, begin - from, stop - begin)
        .copy_(piece.values.narrow(0, begin - piece.from, stop - begin));
  }
  return Status::Ok();
}

StatusOr<at::Tensor> TensorPieces::Whole(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return InternalError("no tensor '" + name + "' is stored");
  at::Tensor whole = at::empty(it->second.shape, at::TensorOptions().dtype(it->second.dtype));
  ENGINE_RETURN_IF_ERROR(ReadInto(name, 0, whole.view({-1})));
  return whole;
}

StatusOr<safetensors::NamedTensors> TensorPieces::TakeWhole(
    const std::function<bool(const std::string&)>& which) {
  safetensors::NamedTensors out;
  for (auto it = tensors_.begin(); it != tensors_.end();) {
    if (!which(it->first)) {
      ++it;
      continue;
    }
    ENGINE_ASSIGN_OR_RETURN(at::Tensor whole, Whole(it->first));
    out.emplace_back(it->first, std::move(whole));
    it = tensors_.erase(it);
  }
  return out;
}

}  // namespace engine
