#include "tokenizer/byte_level.h"

#include <array>
#include <unordered_map>

#include "tokenizer/utf8.h"

namespace engine::tokenizer {
namespace {

struct ByteMap {
  std::array<std::string, 256> to_char;
  std::unordered_map<char32_t, unsigned char> to_byte;
};

const ByteMap& Map() {
  static const ByteMap map = [] {
    ByteMap built;
    int shifted = 0;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                             (byte >= 0xAE && byte <= 0xFF);
      const char32_t c = printable ? static_cast<char32_t>(byte) : 256 + shifted++;
      AppendUtf8(c, &built.to_char[byte]);
      built.to_byte[c] = static_cast<unsigned char>(byte);
    }
    return built;
  }();
  return map;
}

}  // namespace

std::string BytesToByteLevel(std::string_view bytes) {
  const ByteMap& map = Map();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char byte : bytes) out += map.to_char[static_cast<unsigned char>(byte)];
  return out;
}

std::string ByteLevelToBytes(std::string_view token) {
  const ByteMap& map = Map();
  std::string out;
  for (size_t pos = 0; pos < token.size();) {
    const auto found = map.to_byte.find(NextCodePoint(token, &pos));
    if (found == map.to_byte.end()) return std::string(token);
    out.push_back(static_cast<char>(found->second));
  }
  return out;
}

}  // namespace engine::tokenizer
