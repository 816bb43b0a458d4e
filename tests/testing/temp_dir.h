// A fresh directory under /tmp, removed with everything in it when the object goes.
#pragma once

#include <filesystem>
#include <string>

namespace engine::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Writes `content` to path()/name (creating parent directories) and returns the full path.
  std::filesystem::path Write(const std::string& name, const std::string& content) const;

 private:
  std::filesystem::path path_;
};

// The digits data file the setup fetched; the test fails with a clear message when it is missing.
std::filesystem::path DigitsDataPath();
// data/fortunes.txt, fetched by scripts/setup.sh.
std::filesystem::path FortunesDataPath();

// Reads a whole file (empty when it cannot be read).
std::string ReadText(const std::filesystem::path& path);

}  // namespace engine::testing
