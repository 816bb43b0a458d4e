// Content hashes of checkpoint files and the escaping of bytes that are not text.
#include "core/file_hash.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/utf8.h"
#include "testing/temp_dir.h"

namespace engine {
namespace {

TEST(FileHashTest, SameBytesSameHashOneChangedByteAnother) {
  testing::TempDir tmp;
  std::string bytes(3 << 20, 'a');  // spans blocks
  auto a = FileContentHash(tmp.Write("a", bytes));
  bytes[bytes.size() / 2] = 'b';
  auto b = FileContentHash(tmp.Write("b", bytes));
  bytes[bytes.size() / 2] = 'a';
  auto a_again = FileContentHash(tmp.Write("c", bytes));
  ASSERT_TRUE(a.ok() && b.ok() && a_again.ok());
  EXPECT_EQ(a->size(), 16u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(*a, *a_again);
  // XXH3-64 of no bytes, as xxhsum -H3 gives it: the hash is the published one, not a variant.
  EXPECT_EQ(*FileContentHash(tmp.Write("empty", "")), "2d06800538d394c2");
}

TEST(FileHashTest, AMissingFileIsAnErrorNamingIt) {
  auto missing = FileContentHash("/nonexistent/model.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), ::testing::HasSubstr("/nonexistent/model.safetensors"));
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
