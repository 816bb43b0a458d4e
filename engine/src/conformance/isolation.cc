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

bool Decode(const std::string& bytes, CheckResult* r) {
  const size_t a = bytes.find('\0');
  const size_t b = a == std::string::npos ? a : bytes.find('\0', a + 1);
  if (b == std::string::npos) return false;
  r->outcome = static_cast<Outcome>(std::atoi(bytes.substr(0, a).c_str()));
  r->plugin_kind = bytes.substr(a + 1, b - a - 1);
  r->detail = bytes.substr(b + 1);
  return true;
}

}  // namespace

CheckResult RunIsolated(const std::string& check, const Target& target, int timeout_seconds) {
  CheckResult result;
  result.check = check;
  char output_path[] = "/tmp/engine-conformance-output-XXXXXX";
  const int output_fd = ::mkstemp(output_path);
  struct OutputFile {
    int fd;
    const char* path;
    ~OutputFile() {
      if (fd >= 0) {
        ::close(fd);
        ::unlink(path);
      }
    }
  } output{output_fd, output_path};
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
    // What the plugin prints is kept for a failure's report, not shown.
    if (output_fd >= 0) {
      ::dup2(output_fd, 1);
      ::dup2(output_fd, 2);
    }
    const std::string answer = Encode(RunCheck(check, target));
    size_t written = 0;
    while (written < answer.size()) {
      const ssize_t n = ::write(fds[1], answer.data() + written, answer.size() - written);
      if (n <= 0) break;
      written += static_cast<size_t>(n);
    }
    ::close(fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  const ChildOutcome child = CollectChild(pid, fds[0], timeout_seconds);
  const std::string& answer = child.output;
  const bool timed_out = child.timed_out;
  const int status = child.wait_status;
  auto said = [&]() -> std::string {
    if (output_fd < 0) return "";
    std::string text;
    char buffer[4096];
    ::lseek(output_fd, 0, SEEK_SET);
    ssize_t n;
    while ((n = ::read(output_fd, buffer, sizeof(buffer))) > 0) text.append(buffer, n);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (text.size() > 400) text = "..." + text.substr(text.size() - 400);
    return text.empty() ? "" : "; it printed: " + text;
  };
  if (timed_out) {
    result.detail = "did not finish within " + std::to_string(timeout_seconds) + " s" + said();
    return result;
  }
  if (WIFSIGNALED(status)) {
    result.detail = std::string("crashed (") + ::strsignal(WTERMSIG(status)) +
                    ") while the check ran the plugin's code" + said();
    return result;
  }
  if (!Decode(answer, &result)) {
    result.outcome = Outcome::kFail;
    result.detail = "the check ended (exit status " +
                    std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                    ") without a result: the plugin's code exited the process" + said();
  }
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
