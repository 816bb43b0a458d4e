// Running conformance checks in child processes, so that nothing a plugin does can take the caller
// down with it.
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>

#include "core/child_output.h"
#include "engine/conformance.h"

namespace engine::conformance {
namespace {

// The child's answer: outcome, plugin kind and detail, separated by NUL bytes.
std::string Encode(const CheckResult& r) {
  return std::to_string(static_cast<int>(r.outcome)) + '\0' + r.plugin_kind + '\0' + r.detail;
}

bool DecodeCheckResult(const std::string& bytes, CheckResult* r) {
  const size_t a = bytes.find('\0');
  const size_t b = a == std::string::npos ? a : bytes.find('\0', a + 1);
  if (b == std::string::npos) return false;
  r->outcome = static_cast<Outcome>(std::atoi(bytes.substr(0, a).c_str()));
  r->plugin_kind = bytes.substr(a + 1, b - a - 1);
  r->detail = bytes.substr(b + 1);
  return true;
}

// A temporary file for what the child prints, removed with this object.
class CapturedOutput {
 public:
  CapturedOutput() : fd_(::mkstemp(path_)) {}
  ~CapturedOutput() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(path_);
    }
  }
  CapturedOutput(const CapturedOutput&) = delete;
  CapturedOutput& operator=(const CapturedOutput&) = delete;

  int fd() const { return fd_; }

  // "; it printed: <the last 400 bytes>", or "" when it printed nothing.
  std::string Said() const {
    if (fd_ < 0) return "";
    std::string text;
    char buffer[4096];
    ::lseek(fd_, 0, SEEK_SET);
    ssize_t n;
    while ((n = ::read(fd_, buffer, sizeof(buffer))) > 0) text.append(buffer, n);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (text.size() > 400) text = "..." + text.substr(text.size() - 400);
    return text.empty() ? "" : "; it printed: " + text;
  }

 private:
  char path_[38] = "/tmp/engine-conformance-output-XXXXXX";
  int fd_;
};

// In the forked child: runs the check, prints into `output`, answers through `answer_fd`, exits.
[[noreturn]] void RunCheckInChild(const std::string& check, const Target& target, int output_fd,
                                  int answer_fd) {
  // What the plugin prints is kept for a failure's report, not shown.
  if (output_fd >= 0) {
    ::dup2(output_fd, 1);
    ::dup2(output_fd, 2);
  }
  const std::string answer = Encode(RunCheck(check, target));
  size_t written = 0;
  while (written < answer.size()) {
    const ssize_t n = ::write(answer_fd, answer.data() + written, answer.size() - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  ::close(answer_fd);
  ::_exit(0);
}

// The result from how the child ended and what it answered.
void ReadChildResult(const ChildOutcome& child, const CapturedOutput& output, int timeout_seconds,
                     CheckResult* result) {
  const int status = child.wait_status;
  if (child.timed_out) {
    result->detail =
        "did not finish within " + std::to_string(timeout_seconds) + " s" + output.Said();
  } else if (WIFSIGNALED(status)) {
    result->detail = std::string("crashed (") + ::strsignal(WTERMSIG(status)) +
                     ") while the check ran the plugin's code" + output.Said();
  } else if (!DecodeCheckResult(child.output, result)) {
    result->outcome = Outcome::kFail;
    result->detail = "the check ended (exit status " +
                     std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                     ") without a result: the plugin's code exited the process" + output.Said();
  }
}

}  // namespace

CheckResult RunIsolated(const std::string& check, const Target& target, int timeout_seconds) {
  CheckResult result;
  result.check = check;
  CapturedOutput output;
  int fds[2];
  if (::pipe(fds) != 0) {
    result.detail = std::string("cannot make a pipe: ") + std::strerror(errno);
    return result;
  }
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    result.detail = std::string("cannot fork: ") + std::strerror(errno);
    return result;
  }
  if (pid == 0) {
    ::close(fds[0]);
    RunCheckInChild(check, target, output.fd(), fds[1]);
  }
  ::close(fds[1]);
  ReadChildResult(CollectChild(pid, fds[0], timeout_seconds), output, timeout_seconds, &result);
  return result;
}

std::vector<CheckResult> RunAll(const Target& target) {
  std::vector<CheckResult> results;
  results.push_back(RunIsolated("manifest", target));
  if (results.back().outcome != Outcome::kPass) return results;
  const std::string contract = ContractCheckFor(results.back().plugin_kind);
  std::vector<std::string> checks = {"options_schema", "bad_options"};
  if (!contract.empty()) checks.push_back(contract);
  for (const std::string& check : checks) results.push_back(RunIsolated(check, target));
  return results;
}

}  // namespace engine::conformance
