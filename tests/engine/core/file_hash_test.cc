// Content hashes of checkpoint files.
#include "core/file_hash.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace engine
