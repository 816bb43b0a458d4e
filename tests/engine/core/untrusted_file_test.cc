// Files from outside are read only when they are regular files within their kind's limit: a
// symlink to a device, a FIFO or a directory is refused at once (a FIFO without waiting for a
// writer), and paths a data file names are checked against the directories they may lead into.
// (ENGINE_FILE_LIMITS, read once per process, is tested through the command: hub_files_test.)
#include "engine/untrusted_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>

#include "testing/temp_dir.h"

namespace engine {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

TEST(UntrustedFileTest, ARegularFileIsReadWhole) {
  testing::TempDir dir;
  const std::string content(200000, 'x');
  auto read = ReadUntrustedFile(dir.Write("config.json", content), FileKind::kConfig);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(*read, content);
}

TEST(UntrustedFileTest, SymlinksAreFollowedAndWhatTheyLeadToIsChecked) {
  testing::TempDir dir;
  fs::create_symlink(dir.Write("real.json", "{}"), dir.path() / "link.json");
  auto read = ReadUntrustedFile(dir.path() / "link.json", FileKind::kConfig);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(*read, "{}");

  for (const char* device : {"/dev/zero", "/dev/urandom"}) {
    SCOPED_TRACE(device);
    const fs::path link = dir.path() / (std::string("device") + (device[5] == 'z' ? "0" : "1"));
    fs::create_symlink(device, link);
    auto refused = ReadUntrustedFile(link, FileKind::kImage);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().message(),
              "'" + link.string() + "' is a character device, not a regular image file");
  }
}

TEST(UntrustedFileTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  testing::TempDir dir;
  const fs::path fifo = dir.path() / "chat_template.jinja";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  auto refused = ReadUntrustedFile(fifo, FileKind::kTemplate);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "'" + fifo.string() + "' is a FIFO, not a regular template file");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(UntrustedFileTest, DirectoriesAndMissingFilesAreNamed) {
  testing::TempDir dir;
  auto directory = ReadUntrustedFile(dir.path(), FileKind::kData);
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.status().message(),
            "'" + dir.path().string() + "' is a directory, not a regular data file");
  auto missing = ReadUntrustedFile(dir.path() / "none.json", FileKind::kConfig);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("cannot open '"));
}

TEST(UntrustedFileTest, EachKindHasALimitThatFitsRealFilesAndSaysHowToRaiseIt) {
  EXPECT_EQ(*FileLimitsSummary(),
            "config 64 MiB, tokenizer 1 GiB, template 16 MiB, image 256 MiB, data 8 GiB, "
            "data_line 16 MiB");
  EXPECT_TRUE(CheckFileLimit(FileKind::kDataLine, 16 << 20, "a.jsonl:3").ok());
  const Status over = CheckFileLimit(FileKind::kDataLine, (16 << 20) + 1, "a.jsonl:3");
  EXPECT_EQ(over.message(),
            "a.jsonl:3 is larger than the 16 MiB limit for data_lines (set "
            "ENGINE_FILE_LIMITS=data_line=SIZE to allow more)");
  EXPECT_EQ(CheckFileLimit(FileKind::kTemplate, uint64_t{17} << 20, "'t.jinja'").message(),
            "'t.jinja' is larger than the 16 MiB limit for template files (set "
            "ENGINE_FILE_LIMITS=template=SIZE to allow more)");
}

TEST(UntrustedFileTest, PathsLeadingOutOfADirectoryAreFoundThroughDotsAndSymlinks) {
  testing::TempDir data;
  testing::TempDir elsewhere;
  data.Write("images/a.png", "x");
  const fs::path outside = elsewhere.Write("b.png", "y");
  fs::create_symlink(outside, data.path() / "images/link.png");
  fs::create_symlink(elsewhere.path(), data.path() / "linked_dir");

  EXPECT_TRUE(IsInsideDirectory(data.path() / "images/a.png", data.path()));
  EXPECT_TRUE(IsInsideDirectory(data.path() / "images/../images/a.png", data.path()));
  EXPECT_TRUE(IsInsideDirectory(data.path() / "images/not_yet.png", data.path()));
  EXPECT_FALSE(IsInsideDirectory(outside, data.path()));
  EXPECT_FALSE(IsInsideDirectory(data.path() / "images/../../x.png", data.path()));
  EXPECT_FALSE(IsInsideDirectory(data.path() / "images/link.png", data.path()));
  EXPECT_FALSE(IsInsideDirectory(data.path() / "linked_dir/b.png", data.path()));
  EXPECT_TRUE(IsInsideDirectory(data.path() / "linked_dir/b.png", elsewhere.path()));
  // An empty directory is the working one, never everything.
  EXPECT_FALSE(IsInsideDirectory(outside, ""));
  // A directory whose name starts like the data directory's is not inside it.
  EXPECT_FALSE(IsInsideDirectory(data.path().string() + "_sibling/x.png", data.path()));
}

}  // namespace
}  // namespace engine
