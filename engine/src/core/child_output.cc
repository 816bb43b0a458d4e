#include "core/child_output.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace engine {

ChildOutcome CollectChild(pid_t pid, int read_fd, int timeout_seconds) {
  ChildOutcome outcome;
  char buffer[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  struct pollfd poll_fd = {read_fd, POLLIN, 0};
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      outcome.timed_out = true;
      break;
    }
    const int ready = ::poll(&poll_fd, 1, static_cast<int>(left));
    if (ready <= 0) continue;  // EINTR or no data yet: the deadline decides
    const ssize_t n = ::read(read_fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    outcome.output.append(buffer, static_cast<size_t>(n));
  }
  ::close(read_fd);
  if (outcome.timed_out) ::kill(pid, SIGKILL);
  while (::waitpid(pid, &outcome.wait_status, 0) < 0 && errno == EINTR) {
  }
  return outcome;
}

}  // namespace engine
