#include "testing/subprocess.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "testing/test_paths.h"

namespace engine::testing {
namespace {

std::string ReadAll(int fd) {
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) out.append(buffer, n);
  return out;
}

}  // namespace

CommandResult RunCommand(const std::vector<std::string>& argv, const std::string& working_dir,
                         const std::map<std::string, std::string>& env) {
  CommandResult result;
  char out_path[] = "/tmp/engine-test-out-XXXXXX";
  char err_path[] = "/tmp/engine-test-err-XXXXXX";
  int out_fd = ::mkstemp(out_path);
  int err_fd = ::mkstemp(err_path);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    if (!working_dir.empty() && ::chdir(working_dir.c_str()) != 0) ::_exit(126);
    for (const auto& [key, value] : env) {
      if (value.empty()) {
        ::unsetenv(key.c_str());
      } else {
        ::setenv(key.c_str(), value.c_str(), 1);
      }
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  result.peak_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  ::lseek(out_fd, 0, SEEK_SET);
  ::lseek(err_fd, 0, SEEK_SET);
  result.out = ReadAll(out_fd);
  result.err = ReadAll(err_fd);
  ::close(out_fd);
  ::close(err_fd);
  ::unlink(out_path);
  ::unlink(err_path);
  return result;
}

CommandResult RunEngine(const std::vector<std::string>& args, const std::string& working_dir,
                        std::map<std::string, std::string> env) {
  std::vector<std::string> argv = {kEngineBinary};
  argv.insert(argv.end(), args.begin(), args.end());
  env.emplace("ENGINE_PLUGIN_PATH", "");
  return RunCommand(argv, working_dir, env);
}

}  // namespace engine::testing
