#include "jinja/unicode.h"

#include <algorithm>

namespace engine::jinja {

std::vector<size_t> CodePointOffsets(std::string_view s) {
  std::vector<size_t> offsets;
  size_t pos = 0;
  while (pos < s.size()) {
    offsets.push_back(pos);
    size_t length = 1;
    DecodeUtf8(s, pos, &length);
    pos += length;
  }
  offsets.push_back(s.size());
  return offsets;
}

bool IsPythonSpace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<char32_t> strip_set;
  if (chars != nullptr) {
    for (size_t pos = 0, length = 1; pos < chars->size(); pos += length) {
      strip_set.push_back(DecodeUtf8(*chars, pos, &length));
    }
  }
  auto strips = [&](char32_t cp) {
    if (chars == nullptr) return IsPythonSpace(cp);
    return std::find(strip_set.begin(), strip_set.end(), cp) != strip_set.end();
  };
  std::vector<size_t> offsets = CodePointOffsets(s);
  size_t first = 0;
  size_t last = offsets.size() - 1;  // index of the end offset
  size_t length = 1;
  while (left && first < last && strips(DecodeUtf8(s, offsets[first], &length))) ++first;
  while (right && last > first && strips(DecodeUtf8(s, offsets[last - 1], &length))) --last;
  return std::string(s.substr(offsets[first], offsets[last] - offsets[first]));
}

}  // namespace engine::jinja
