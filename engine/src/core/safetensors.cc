#include "engine/safetensors.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "engine/dtype.h"
#include "engine/json_text.h"
#include "engine/untrusted_file.h"

namespace engine::safetensors {
namespace {

constexpr const char* kMetadataKey = "__metadata__";

std::string Quote(const std::string& s) { return JsonText(s); }

// Bytes of a tensor of `shape` and `itemsize`, or nullopt on overflow or a negative dimension.
std::optional<uint64_t> ByteSize(const std::vector<int64_t>& shape, size_t itemsize) {
  uint64_t total = itemsize;
  for (int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    if (dim != 0 && total > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
      return std::nullopt;
    }
    total *= static_cast<uint64_t>(dim);
  }
  return total;
}

}  // namespace

namespace {

struct WriteEntry {
  std::string name;
  at::Tensor tensor;  // contiguous, CPU
  std::string_view dtype_name;
};

// The tensors to write, each checked (a name, once, not the metadata key; a dtype the format
// holds), larger items first, then by name: every tensor starts aligned to its item size, as the
// reference implementation lays them out.
StatusOr<std::vector<WriteEntry>> EntriesToWrite(const NamedTensors& tensors) {
  std::vector<WriteEntry> entries;
  entries.reserve(tensors.size());
  std::set<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty()) return InvalidArgumentError("safetensors: a tensor has an empty name");
    if (name == kMetadataKey) {
      return InvalidArgumentError("safetensors: '__metadata__' cannot name a tensor");
    }
    if (!seen.insert(name).second) {
      return InvalidArgumentError("safetensors: tensor '" + name + "' is given twice");
    }
    if (!tensor.defined()) {
      return InvalidArgumentError("safetensors: tensor '" + name + "' is undefined");
    }
    auto dtype_name = SafetensorsDtypeName(tensor.scalar_type());
    if (!dtype_name) {
      return InvalidArgumentError("safetensors: tensor '" + name + "' has dtype " +
                                  std::string(DtypeShortName(tensor.scalar_type())) +
                                  ", which safetensors cannot hold here");
    }
    entries.push_back({name, tensor.detach().cpu().contiguous(), *dtype_name});
  }
  std::sort(entries.begin(), entries.end(), [](const WriteEntry& a, const WriteEntry& b) {
    size_t ia = a.tensor.element_size(), ib = b.tensor.element_size();
    if (ia != ib) return ia > ib;
    return a.name < b.name;
  });
  return entries;
}

// The JSON header for `entries` laid out back to back in their order, padded with spaces so the
// data section starts 8-byte aligned.
std::string HeaderFor(const std::vector<WriteEntry>& entries, const Metadata& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += Quote(kMetadataKey) + ":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ",";
      first = false;
      header += Quote(key) + ":" + Quote(value);
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const WriteEntry& e : entries) {
    const uint64_t begin = offset;
    offset += e.tensor.nbytes();
    if (header.size() > 1) header += ",";
    header += Quote(e.name) + ":{\"dtype\":\"" + std::string(e.dtype_name) + "\",\"shape\":[";
    for (int64_t d = 0; d < e.tensor.dim(); ++d) {
      if (d > 0) header += ",";
      header += std::to_string(e.tensor.size(d));
    }
    header += "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(offset) + "]}";
  }
  header += "}";
  while ((8 + header.size()) % 8 != 0) header += ' ';
  return header;
}

}  // namespace

Status Write(const std::filesystem::path& path, const NamedTensors& tensors,
             const Metadata& metadata) {
  ENGINE_ASSIGN_OR_RETURN(std::vector<WriteEntry> entries, EntriesToWrite(tensors));
  const std::string header = HeaderFor(entries, metadata);
  return WriteFileAtomically(path, [&](const ByteSink& sink) -> Status {
    uint64_t n = header.size();
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
    ENGINE_RETURN_IF_ERROR(sink(length, sizeof(length)));
    ENGINE_RETURN_IF_ERROR(sink(header.data(), header.size()));
    for (const WriteEntry& e : entries) {
      if (e.tensor.nbytes() == 0) continue;
      ENGINE_RETURN_IF_ERROR(sink(e.tensor.data_ptr(), e.tensor.nbytes()));
    }
    return Status::Ok();
  });
}

struct File::Mapping {
  void* address = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (address != MAP_FAILED) ::munmap(address, size);
  }
};

File::~File() = default;

namespace {

// The file mapped privately and writable (tensors may be modified in place without touching the
// file), with the size it had; at least the 8 bytes of the header length.
StatusOr<std::pair<void*, uint64_t>> MapPrivately(const std::filesystem::path& path,
                                                  const std::string& where) {
  uint64_t file_size = 0;
  ENGINE_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, "safetensors", &file_size));
  if (file_size < 8) {
    ::close(fd);
    return DataLossError(where + " is truncated: " + std::to_string(file_size) +
                         " bytes, fewer than the 8-byte header length");
  }
  void* address = ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (address == MAP_FAILED)
    return IoError("cannot map " + where + ": " + std::strerror(map_errno));
  return std::make_pair(address, file_size);
}

// The header's length from its first 8 bytes, checked against the format's limit and the file.
StatusOr<uint64_t> HeaderSize(const uint8_t* bytes, uint64_t file_size, const std::string& where) {
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  if (header_size > kMaxHeaderBytes) {
    return DataLossError(where + " is corrupt: its header claims " + std::to_string(header_size) +
                         " bytes (the limit is " + std::to_string(kMaxHeaderBytes) + ")");
  }
  if (header_size > file_size - 8) {
    return DataLossError(where + " is truncated: the header needs " + std::to_string(header_size) +
                         " bytes but only " + std::to_string(file_size - 8) + " follow");
  }
  return header_size;
}

// The format's header nests three deep ({name: {"shape": [sizes]}}); JSON values cost 16 bytes
// and more each, so a header of 100 MB could otherwise hold tens of millions of them.
constexpr int kMaxHeaderNesting = 3;
constexpr int64_t kMaxHeaderValues = 4 << 20;

// Thrown from the parser's callback to stop at the first value past a budget.
struct HeaderOverBudget {
  std::string problem;
};

// The header as a JSON object whose keys are unique (JSON itself allows repeats; the format not),
// parsed within kMaxHeaderNesting and kMaxHeaderValues.
StatusOr<nlohmann::json> ParseHeader(const char* begin, uint64_t size, const std::string& where) {
  using Event = nlohmann::json::parse_event_t;
  std::set<std::string> keys;
  std::string duplicate;
  int64_t values = 0;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(
        begin, begin + size, [&](int depth, Event event, nlohmann::json& parsed) {
          if (depth == 1 && event == Event::key) {
            const std::string& key = parsed.get_ref<const std::string&>();
            if (!keys.insert(key).second && duplicate.empty()) duplicate = key;
          }
          if ((event == Event::object_start || event == Event::array_start) &&
              depth >= kMaxHeaderNesting) {
            throw HeaderOverBudget{"nests arrays or objects more than " +
                                   std::to_string(kMaxHeaderNesting) + " deep"};
          }
          if ((event == Event::value || event == Event::object_start ||
               event == Event::array_start) &&
              ++values > kMaxHeaderValues) {
            throw HeaderOverBudget{"holds more than " + std::to_string(kMaxHeaderValues) +
                                   " values"};
          }
          return true;
        });
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(where + " is corrupt: its header is not valid JSON (" + e.what() + ")");
  } catch (const HeaderOverBudget& over) {
    return DataLossError(where + " is corrupt: its header " + over.problem);
  }
  if (!header.is_object()) return DataLossError(where + " is corrupt: its header is not an object");
  if (!duplicate.empty()) {
    return DataLossError(where + " is corrupt: its header names '" + duplicate + "' twice");
  }
  return header;
}

StatusOr<Metadata> ReadMetadata(const nlohmann::json& value, const std::string& where) {
  if (!value.is_object()) return DataLossError(where + ": '__metadata__' is not an object");
  Metadata metadata;
  for (auto m = value.begin(); m != value.end(); ++m) {
    if (!m.value().is_string()) {
      return DataLossError(where + ": metadata '" + m.key() + "' is not a string");
    }
    metadata[m.key()] = m.value().get<std::string>();
  }
  return metadata;
}

StatusOr<std::vector<int64_t>> ReadShape(const nlohmann::json& value, const std::string& where) {
  auto shape_it = value.find("shape");
  if (shape_it == value.end() || !shape_it->is_array()) {
    return DataLossError(where + ": 'shape' is missing or not an array");
  }
  std::vector<int64_t> shape;
  for (const auto& dim : *shape_it) {
    if (!dim.is_number_unsigned()) {
      return DataLossError(where + ": 'shape' holds something other than sizes");
    }
    uint64_t d = dim.get<uint64_t>();
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return DataLossError(where + ": a dimension is too large");
    }
    shape.push_back(static_cast<int64_t>(d));
  }
  return shape;
}

// One tensor's entry: a known dtype, a shape, and offsets inside the data that its shape fills.
StatusOr<TensorInfo> ReadEntry(const std::string& name, const nlohmann::json& value,
                               uint64_t data_size, const std::string& where) {
  const std::string tensor_where = where + ", tensor '" + name + "'";
  if (!value.is_object()) return DataLossError(tensor_where + ": entry is not an object");
  auto dtype_it = value.find("dtype");
  if (dtype_it == value.end() || !dtype_it->is_string()) {
    return DataLossError(tensor_where + ": 'dtype' is missing or not a string");
  }
  auto dtype = DtypeFromSafetensorsName(dtype_it->get<std::string>());
  if (!dtype) {
    return DataLossError(tensor_where + ": dtype '" + dtype_it->get<std::string>() +
                         "' is not supported");
  }
  TensorInfo info;
  info.name = name;
  info.dtype = *dtype;
  ENGINE_ASSIGN_OR_RETURN(info.shape, ReadShape(value, tensor_where));
  auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return DataLossError(tensor_where + ": 'data_offsets' must be two non-negative integers");
  }
  info.begin = (*offsets_it)[0].get<uint64_t>();
  info.end = (*offsets_it)[1].get<uint64_t>();
  if (info.begin > info.end || info.end > data_size) {
    return DataLossError(tensor_where + ": data_offsets [" + std::to_string(info.begin) + ", " +
                         std::to_string(info.end) + "] lie outside the " +
                         std::to_string(data_size) + " data bytes (truncated file?)");
  }
  auto expected = ByteSize(info.shape, c10::elementSize(info.dtype));
  if (!expected || *expected != info.end - info.begin) {
    return DataLossError(tensor_where + ": its shape needs " +
                         (expected ? std::to_string(*expected) : std::string("too many")) +
                         " bytes but data_offsets cover " + std::to_string(info.end - info.begin));
  }
  return info;
}

// `tensors`, sorted by offset, must cover the data section exactly: no gap, no overlap.
Status CheckCoverage(const std::vector<TensorInfo>& tensors, uint64_t data_size,
                     const std::string& where) {
  uint64_t covered = 0;
  for (const TensorInfo& info : tensors) {
    if (info.begin != covered) {
      return DataLossError(where + " is corrupt: tensor '" + info.name + "' starts at byte " +
                           std::to_string(info.begin) + " of the data, expected " +
                           std::to_string(covered) +
                           (info.begin < covered ? " (overlap)" : " (gap)"));
    }
    covered = info.end;
  }
  if (covered != data_size) {
    return DataLossError(where + " is corrupt: tensors cover " + std::to_string(covered) +
                         " data bytes but the file holds " + std::to_string(data_size));
  }
  return Status::Ok();
}

}  // namespace

// Checked step by step as the format is laid out: the mapping, the header's length, the header's
// JSON, each entry, then that the entries tile the data. Nothing is returned before all passed.
StatusOr<std::shared_ptr<const File>> File::Open(const std::filesystem::path& path) {
  const std::string where = "safetensors file '" + path.string() + "'";
  ENGINE_ASSIGN_OR_RETURN(auto mapped, MapPrivately(path, where));
  auto mapping = std::make_shared<Mapping>();
  mapping->address = mapped.first;
  mapping->size = mapped.second;
  const uint64_t file_size = mapped.second;
  const auto* bytes = static_cast<const uint8_t*>(mapping->address);
  ENGINE_ASSIGN_OR_RETURN(const uint64_t header_size, HeaderSize(bytes, file_size, where));
  const uint64_t data_size = file_size - 8 - header_size;
  ENGINE_ASSIGN_OR_RETURN(
      nlohmann::json header,
      ParseHeader(reinterpret_cast<const char*>(bytes + 8), header_size, where));

  std::shared_ptr<File> file(new File());
  file->path_ = path;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      ENGINE_ASSIGN_OR_RETURN(file->metadata_, ReadMetadata(it.value(), where));
      continue;
    }
    ENGINE_ASSIGN_OR_RETURN(TensorInfo info, ReadEntry(it.key(), it.value(), data_size, where));
    file->tensors_.push_back(std::move(info));
  }
  std::sort(file->tensors_.begin(), file->tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  ENGINE_RETURN_IF_ERROR(CheckCoverage(file->tensors_, data_size, where));
  for (size_t i = 0; i < file->tensors_.size(); ++i) file->index_[file->tensors_[i].name] = i;
  file->mapping_ = std::move(mapping);
  file->data_ = bytes + 8 + header_size;
  return std::shared_ptr<const File>(std::move(file));
}

const TensorInfo* File::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

StatusOr<at::Tensor> File::Get(const std::string& name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return NotFoundError("safetensors file '" + path_.string() + "' has no tensor '" + name + "'");
  }
  auto options = at::TensorOptions().dtype(info->dtype).device(at::kCPU);
  const size_t nbytes = info->end - info->begin;
  if (nbytes == 0) return at::empty(info->shape, options);
  uint8_t* ptr = const_cast<uint8_t*>(data_ + info->begin);
  if (reinterpret_cast<uintptr_t>(ptr) % c10::elementSize(info->dtype) != 0) {
    at::Tensor copy = at::empty(info->shape, options);
    std::memcpy(copy.data_ptr(), ptr, nbytes);
    return copy;
  }
  std::shared_ptr<Mapping> keep_alive = mapping_;
  return at::from_blob(
      ptr, info->shape, [keep_alive](void*) mutable { keep_alive.reset(); }, options);
}

void File::ReleasePages(const std::string& name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr || mapping_ == nullptr) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data_ + info->begin);
  const auto end = reinterpret_cast<uintptr_t>(data_ + info->end);
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = end / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

StatusOr<NamedTensors> File::GetAll() const {
  NamedTensors out;
  out.reserve(tensors_.size());
  for (const TensorInfo& info : tensors_) {
    ENGINE_ASSIGN_OR_RETURN(at::Tensor t, Get(info.name));
    out.emplace_back(info.name, std::move(t));
  }
  return out;
}

}  // namespace engine::safetensors
