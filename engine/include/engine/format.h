// Numbers as messages and plans print them, shared by the engine and plugins so they read alike.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

namespace engine {

// The shortest usual form: 0.003, 1e-08, 1.5, 42.
inline std::string FormatNumber(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// Fixed-point with `decimals` digits: FormatFixed(4.1272, 3) -> "4.127".
inline std::string FormatFixed(double value, int decimals) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(decimals);
  out << value;
  return out.str();
}

// 1797 -> "1,797".
inline std::string WithThousands(int64_t value) {
  const std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

}  // namespace engine
