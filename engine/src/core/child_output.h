// Waiting for a forked child that reports through a pipe: the plugin loader's probe and each
// conformance check run plugin code in a child this way, so a crash or a hang there costs only the
// child.
//
// CollectChild reads `read_fd` until the child closes it or `timeout_seconds` pass, closes it,
// kills the child on timeout, and reaps it. Retries on EINTR; never throws.
#pragma once

#include <sys/types.h>

#include <string>

namespace engine {

struct ChildOutcome {
  std::string output;      // what the child wrote to the pipe
  bool timed_out = false;  // the child was killed at the deadline
  int wait_status = 0;     // as waitpid reports it
};

ChildOutcome CollectChild(pid_t pid, int read_fd, int timeout_seconds);

}  // namespace engine
