#include "core/remove_tree.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "testing/temp_dir.h"

namespace engine {
namespace {

using ::engine::testing::TempDir;

TEST(RemoveTreeTest, RemovesNestedDirectoriesAndFiles) {
  TempDir dir;
  const auto root = dir.path() / "tree";
  std::filesystem::create_directories(root / "a" / "b");
  std::ofstream(root / "a" / "b" / "f.bin") << "data";
  std::ofstream(root / "top.txt") << "x";
  std::error_code ec;
  RemoveTree(root, ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(std::filesystem::exists(root));
}

TEST(RemoveTreeTest, RemovesLinksWithoutFollowingThem) {
  TempDir dir;
  const auto kept = dir.path() / "kept";
  std::filesystem::create_directories(kept);
  std::ofstream(kept / "precious.txt") << "keep me";
  const auto root = dir.path() / "tree";
  std::filesystem::create_directories(root);
  std::filesystem::create_directory_symlink(kept, root / "link");
  std::error_code ec;
  RemoveTree(root, ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(std::filesystem::exists(root));
  EXPECT_TRUE(std::filesystem::exists(kept / "precious.txt"));
}

TEST(RemoveTreeTest, SingleFilesAndMissingPaths) {
  TempDir dir;
  const auto file = dir.path() / "f.txt";
  std::ofstream(file) << "x";
  std::error_code ec;
  RemoveTree(file, ec);
  EXPECT_FALSE(ec);
  EXPECT_FALSE(std::filesystem::exists(file));
  RemoveTree(dir.path() / "never-there", ec);
  EXPECT_FALSE(ec);
}

TEST(RemoveTreeTest, ReportsWhatItCannotRemove) {
  if (::geteuid() == 0) GTEST_SKIP() << "root may remove anything";
  TempDir dir;
  const auto locked = dir.path() / "locked";
  std::filesystem::create_directories(locked / "inner");
  std::ofstream(locked / "inner" / "f") << "x";
  ::chmod((locked / "inner").c_str(), 0500);
  std::error_code ec;
  RemoveTree(locked, ec);
  EXPECT_TRUE(ec);
  EXPECT_TRUE(std::filesystem::exists(locked / "inner" / "f"));
  ::chmod((locked / "inner").c_str(), 0700);
}

}  // namespace
}  // namespace engine
