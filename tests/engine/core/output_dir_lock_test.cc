// One run per output directory: a second holder is refused naming the first, and a holder that
// dies (even by SIGKILL) leaves nothing that blocks the next run.
#include "core/output_dir_lock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testing/temp_dir.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

TEST(OutputDirLockTest, ASecondHolderIsRefusedNamingTheDirectoryAndThePid) {
  testing::TempDir tmp;
  const auto dir = tmp.path() / "out";
  auto first = OutputDirLock::Acquire(dir, "engine run first.pbtxt");
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_TRUE(std::filesystem::exists(dir / kOutputDirLockFile));
  auto second = OutputDirLock::Acquire(dir, "engine run second.pbtxt");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      second.status().message(),
      HasSubstr("the output directory '" + dir.string() + "' is in use by another run: pid " +
                std::to_string(::getpid()) + " (engine run first.pbtxt)"));
  first->reset();
  EXPECT_TRUE(OutputDirLock::Acquire(dir, "engine run second.pbtxt").ok());
}

TEST(OutputDirLockTest, AHolderKilledWithSigkillLeavesNoStaleLock) {
  testing::TempDir tmp;
  const auto dir = tmp.path() / "out";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto lock = OutputDirLock::Acquire(dir, "engine run doomed.pbtxt");
    const char ok = lock.ok() ? 'y' : 'n';
    (void)!::write(ready[1], &ok, 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 'y');
  auto while_alive = OutputDirLock::Acquire(dir, "engine run next.pbtxt");
  ASSERT_FALSE(while_alive.ok());
  EXPECT_THAT(while_alive.status().message(), HasSubstr("pid " + std::to_string(child)));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(std::filesystem::exists(dir / kOutputDirLockFile)) << "the file stays behind";
  auto after = OutputDirLock::Acquire(dir, "engine run next.pbtxt");
  EXPECT_TRUE(after.ok()) << after.status().message();
}

TEST(OutputDirLockTest, ReleaseUnusedLeavesNoTraceOfWhatItCreated) {
  testing::TempDir tmp;
  auto lock = OutputDirLock::Acquire(tmp.path() / "runs/out", "engine run p.pbtxt");
  ASSERT_TRUE(lock.ok()) << lock.status().message();
  (*lock)->ReleaseUnused();
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "runs"));
  std::filesystem::create_directories(tmp.path() / "kept");
  lock = OutputDirLock::Acquire(tmp.path() / "kept", "engine run p.pbtxt");
  ASSERT_TRUE(lock.ok());
  (*lock)->ReleaseUnused();
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "kept"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "kept" / kOutputDirLockFile));
}

TEST(OutputDirLockTest, AnOutputDirThatCannotBeCreatedIsAnErrorNamingIt) {
  testing::TempDir tmp;
  const auto file = tmp.Write("plain-file", "not a directory");
  auto lock = OutputDirLock::Acquire(file / "out", "engine run p.pbtxt");
  ASSERT_FALSE(lock.ok());
  EXPECT_THAT(lock.status().message(),
              HasSubstr("cannot create the output directory '" + (file / "out").string() + "'"));
}

}  // namespace
}  // namespace engine
