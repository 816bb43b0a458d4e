// A small stable hash for identities and fingerprints (FNV-1a, 64 bits).
//
// Stable across runs, machines and versions, which std::hash is not. Not cryptographic: it detects
// accidental change, nothing more.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace engine {

inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ULL;

inline uint64_t Fnv1a64(std::string_view bytes, uint64_t hash = kFnv1a64Offset) {
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

// 16 lowercase hex digits.
inline std::string HashHex(uint64_t hash) {
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%016llx", static_cast<unsigned long long>(hash));
  return buffer;
}

inline std::string Fnv1a64Hex(std::string_view bytes) { return HashHex(Fnv1a64(bytes)); }

}  // namespace engine
