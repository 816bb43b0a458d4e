// The engine's one UTF-8 codec: well-formed sequences decode to their code points and back, and
// every invalid subpart is one U+FFFD of the length the WHATWG decoder (and Python's
// errors="replace", and Rust's from_utf8_lossy) gives it; bytes that are not text print escaped.
#include "engine/utf8.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace engine {
namespace {

// The code points of `s` and the bytes each spans.
std::vector<std::pair<char32_t, size_t>> Decode(const std::string& s) {
  std::vector<std::pair<char32_t, size_t>> out;
  for (size_t pos = 0, length = 0; pos < s.size(); pos += length) {
    const char32_t cp = DecodeUtf8(s, pos, &length);
    out.emplace_back(cp, length);
  }
  return out;
}

TEST(Utf8Test, WellFormedSequencesDecodeAndEncodeBack) {
  const std::vector<char32_t> code_points = {U'a',   0x7F,   0x80,    0xE9,    0x7FF,   0x800,
                                             0xFFFD, 0xFFFF, 0x10000, 0x1F600, 0x10FFFF};
  std::string text;
  for (char32_t cp : code_points) AppendUtf8(cp, &text);
  const auto decoded = Decode(text);
  ASSERT_EQ(decoded.size(), code_points.size());
  for (size_t i = 0; i < code_points.size(); ++i) EXPECT_EQ(decoded[i].first, code_points[i]);
  EXPECT_EQ(Decode("caf\xc3\xa9")[3], (std::pair<char32_t, size_t>(0xE9, 2)));
  EXPECT_EQ(CountInvalidUtf8Bytes(text), 0u);
}

TEST(Utf8Test, EachMaximalInvalidSubpartIsOneReplacementCharacter) {
  // The Unicode standard's example (U+FFFD substitution of maximal subparts, table 3-8):
  // 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a, FFFD (F1 80 80), FFFD (E1 80), FFFD (C2), b,
  // FFFD (80), c, FFFD (80), FFFD (BF), d.
  const auto decoded = Decode("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64");
  const std::vector<std::pair<char32_t, size_t>> expected = {
      {U'a', 1},   {0xFFFD, 3}, {0xFFFD, 2}, {0xFFFD, 1}, {U'b', 1},
      {0xFFFD, 1}, {U'c', 1},   {0xFFFD, 1}, {0xFFFD, 1}, {U'd', 1}};
  EXPECT_EQ(decoded, expected);
  // Overlong forms, surrogates and code points past U+10FFFF are not well-formed.
  for (const char* bad : {"\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80"}) {
    EXPECT_EQ(Utf8SequenceLength(bad), 0u) << bad;
    EXPECT_EQ(Decode(bad).front().first, 0xFFFDu);
  }
  size_t invalid = 0;
  EXPECT_EQ(Utf8SequenceLength("\xF0\x9F\x98", &invalid), 0u);  // cut short
  EXPECT_EQ(invalid, 3u);
}

TEST(Utf8Test, PrintableEscapesControlAndInvalidBytesAndKeepsText) {
  EXPECT_EQ(Printable("caf\xc3\xa9 ok\n"), "caf\xc3\xa9 ok\n");
  EXPECT_EQ(Printable(std::string("a\x1b[2Jb\0c\xff", 9)), "a\\x1b[2Jb\\x00c\\xff");
  EXPECT_EQ(Printable("\xc3"), "\\xc3");                    // cut short
  EXPECT_EQ(Printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(CountInvalidUtf8Bytes("\xf0\x9f\x98\x80 \xfe\xfe"), 2u);
}

}  // namespace
}  // namespace engine
