#include "testing/temp_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>

#include "core/remove_tree.h"
#include "testing/test_paths.h"

namespace engine::testing {

TempDir::TempDir() {
  char pattern[] = "/tmp/engine-test-XXXXXX";
  const char* made = ::mkdtemp(pattern);
  path_ = made != nullptr ? made : "/tmp";
}

TempDir::~TempDir() {
  std::error_code ec;
  // Tests may leave read-only directories behind; make them removable first.
  for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
  }
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ec);
  RemoveTree(path_, ec);
}

std::filesystem::path TempDir::Write(const std::string& name, const std::string& content) const {
  std::filesystem::path file = path_ / name;
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << content;
  return file;
}

std::filesystem::path DigitsDataPath() {
  std::filesystem::path path = std::filesystem::path(kDataDir) / "digits.csv.gz";
  EXPECT_TRUE(std::filesystem::exists(path))
      << path << " is missing: run `scripts/setup.sh test` (it fetches the data) first";
  return path;
}

std::filesystem::path FortunesDataPath() {
  std::filesystem::path path = std::filesystem::path(kDataDir) / "fortunes.txt";
  EXPECT_TRUE(std::filesystem::exists(path))
      << path << " is missing: run `scripts/setup.sh test` (it fetches the data) first";
  return path;
}

std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace engine::testing
