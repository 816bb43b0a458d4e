// The exclusive right to write into an output directory, held by one `engine run` at a time.
//
// Two runs writing the same directory would replace each other's checkpoints or remove each
// other's temporary directories. Acquire takes flock(LOCK_EX) on <dir>/.engine.lock without
// waiting and writes the holder's pid and command line into the file, so the refusal of a second
// run can name the first. The kernel drops the lock when the holding process dies, however it dies
// (kill -9 included): a lock file left behind never blocks anything. The file itself stays.
//
// Creates `dir` when missing, so an output directory that cannot be created or written fails here,
// before any training. Release is the destructor. The lock is per open file description: forked
// children share it for their lifetime, exec'd ones do not (O_CLOEXEC).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "engine/status.h"

namespace engine {

inline constexpr const char* kOutputDirLockFile = ".engine.lock";

class OutputDirLock {
 public:
  // `holder` describes this process for a refused second run ("engine run p.pbtxt"). Errors:
  // FAILED_PRECONDITION when another live process holds the lock (naming the directory and its pid
  // and command), IO errors naming the path when the directory cannot be created or written.
  static StatusOr<std::unique_ptr<OutputDirLock>> Acquire(const std::filesystem::path& dir,
                                                          const std::string& holder);
  ~OutputDirLock();

  // Releases the lock of a run that wrote nothing (its pipeline failed to plan), removing the lock
  // file and the directories Acquire created, so that a refused pipeline leaves no trace.
  void ReleaseUnused();
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;

 private:
  OutputDirLock(int fd, std::filesystem::path dir, std::filesystem::path created)
      : fd_(fd), dir_(std::move(dir)), created_(std::move(created)) {}
  int fd_;
  std::filesystem::path dir_;
  // The outermost directory Acquire created; empty when `dir_` existed.
  std::filesystem::path created_;
};

}  // namespace engine
