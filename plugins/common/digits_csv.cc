#include "digits_csv.h"

#include <ATen/ops/empty.h>

#include <cmath>
#include <cstring>

#include "engine/hash.h"
#include "engine/utf8.h"
#include "read_file.h"

namespace engine::plugins {
namespace {

Status ParseLine(std::string_view line, const std::string& where, std::vector<float>* pixels,
                 std::vector<int64_t>* labels) {
  int column = 0;
  size_t start = 0;
  while (start <= line.size()) {
    size_t end = line.find(',', start);
    if (end == std::string_view::npos) end = line.size();
    std::string_view field = line.substr(start, end - start);
    start = end + 1;
    ++column;
    if (column > kDigitPixels + 1) {
      return DataLossError(where + ": more than " + std::to_string(kDigitPixels + 1) +
                           " values (64 pixels and a label expected)");
    }
    int value = 0;
    bool ok = !field.empty() && field.size() <= 3;
    for (char c : field) {
      if (c < '0' || c > '9') ok = false;
      value = value * 10 + (c - '0');
    }
    if (!ok) {
      // The field may be any bytes (a binary file read as CSV): escaped, and cut short.
      const std::string shown = Printable(field.substr(0, 40)) + (field.size() > 40 ? "..." : "");
      return DataLossError(where + ": value " + std::to_string(column) + " is '" + shown +
                           "', not a small non-negative integer");
    }
    if (column <= kDigitPixels) {
      if (value > 16) {
        return DataLossError(where + ": pixel " + std::to_string(column) + " is " +
                             std::to_string(value) + ", outside 0..16");
      }
      pixels->push_back(static_cast<float>(value));
    } else {
      if (value >= kDigitClasses) {
        return DataLossError(where + ": label " + std::to_string(value) + " is outside 0..9");
      }
      labels->push_back(value);
    }
    if (end == line.size()) break;
  }
  if (column != kDigitPixels + 1) {
    return DataLossError(where + ": " + std::to_string(column) +
                         " values; 65 expected (64 pixels and a label)");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<DigitsTable> ReadDigitsCsv(const std::filesystem::path& path) {
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
    ENGINE_RETURN_IF_ERROR(
        ParseLine(line, path.string() + ":" + std::to_string(line_number), &pixels, &labels));
  }
  const int64_t n = static_cast<int64_t>(labels.size());
  if (n == 0) return DataLossError("'" + path.string() + "' holds no images");
  DigitsTable table;
  table.pixels = at::empty({n, kDigitPixels}, at::kFloat);
  std::memcpy(table.pixels.data_ptr<float>(), pixels.data(), pixels.size() * sizeof(float));
  table.labels = at::empty({n}, at::kLong);
  std::memcpy(table.labels.data_ptr<int64_t>(), labels.data(), labels.size() * sizeof(int64_t));
  table.content_hash = Fnv1a64Hex(text);
  return table;
}

}  // namespace engine::plugins
