#include "cli/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <thread>

#include "cli/commands.h"

namespace engine::cli {
namespace {

std::atomic<int> forwarded_signal{0};

void RecordSignal(int signal) { forwarded_signal.store(signal); }

// Binds 127.0.0.1:port (0: any free port) and returns the port, or -1 with errno set.
int BindLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  socklen_t size = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  ::close(fd);
  return ntohs(address.sin_port);
}

std::string DescribeExitStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           ::strsignal(WTERMSIG(status)) + ")";
  }
  return "ended";
}

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kExitFailure;
}

// The rendezvous port: MASTER_PORT when given (and free), else any free one. Returns the port, or
// the exit code after saying why there is none.
struct PortChoice {
  int port = 0;
  int exit_code = kExitOk;  // not kExitOk: no port
};

PortChoice ChooseMasterPort() {
  const char* given = std::getenv("MASTER_PORT");
  if (given == nullptr || *given == '\0') {
    const int port = BindLoopback(0);
    if (port < 0) {
      std::cerr << "engine run: cannot find a free port on 127.0.0.1: " << std::strerror(errno)
                << "\n";
      return {0, kExitFailure};
    }
    return {port, kExitOk};
  }
  const int port = std::atoi(given);
  if (port <= 0 || port > 65535) {
    std::cerr << "engine run: MASTER_PORT='" << given << "' is not a port\n";
    return {0, kExitUsage};
  }
  if (BindLoopback(port) < 0) {
    std::cerr << "engine run: MASTER_PORT=" << port << " is in use on 127.0.0.1 ("
              << std::strerror(errno)
              << "); free it, choose another, or unset MASTER_PORT and --nproc picks a free one\n";
    return {0, kExitFailure};
  }
  return {port, kExitOk};
}

// SIGINT and SIGTERM are recorded, to be forwarded to the ranks by SuperviseRanks.
void RecordStopSignals() {
  struct sigaction action {};
  action.sa_handler = RecordSignal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

// The ranks, in one process group so that signals reach all of them.
struct RankGroup {
  pid_t group = 0;
  std::map<pid_t, int> ranks;  // pid -> rank, while running
};

// In the forked child: the rank's environment, then `engine run` again. Never returns.
[[noreturn]] void ExecRank(int rank, int nproc, int port, pid_t group, pid_t launcher,
                           std::vector<char*>& argv) {
  ::setpgid(0, group);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(kExitFailure);
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  if (rank != 0) {
    // Every rank prints the same plan and summaries; rank 0's are shown, everyone's errors.
    const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null >= 0) ::dup2(null, STDOUT_FILENO);
  }
  ::execv("/proc/self/exe", argv.data());
  std::cerr << "engine run: cannot start rank " << rank << ": " << std::strerror(errno) << "\n";
  ::_exit(127);
}

// Forks `nproc` ranks running `engine run run_args`; false (the started ones killed) when a fork
// fails.
bool StartRanks(int nproc, int port, const std::vector<std::string>& run_args, RankGroup* out) {
  std::vector<std::string> argv_strings = {"engine", "run"};
  argv_strings.insert(argv_strings.end(), run_args.begin(), run_args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t launcher = ::getpid();
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::cerr << "engine run: cannot start rank " << rank << ": " << std::strerror(errno) << "\n";
      if (out->group != 0) ::killpg(out->group, SIGKILL);
      while (::wait(nullptr) > 0) {
      }
      return false;
    }
    if (pid == 0) ExecRank(rank, nproc, port, out->group, launcher, argv);
    if (out->group == 0) out->group = pid;
    ::setpgid(pid, out->group);
    out->ranks[pid] = rank;
  }
  std::cerr << "engine run: started " << nproc << " ranks on 127.0.0.1:" << port << ", pids";
  for (const auto& [pid, rank] : out->ranks) std::cerr << " " << pid;
  std::cerr << std::endl;
  return true;
}

// Waits for every rank, forwarding stop signals; the first failing rank stops the others (SIGTERM,
// then SIGKILL after 5 s). Returns the launcher's exit code. One loop with its state (who is left,
// whether stopping, the kill deadline), so one function, longer than most.
int SuperviseRanks(RankGroup& ranks_group) {
  std::map<pid_t, int>& ranks = ranks_group.ranks;
  const pid_t group = ranks_group.group;
  int result = kExitOk;
  bool stopping = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (!ranks.empty()) {
    if (const int signal = forwarded_signal.exchange(0); signal != 0) {
      std::cerr << "engine run: forwarding " << (signal == SIGINT ? "SIGINT" : "SIGTERM") << " ("
                << ::strsignal(signal) << ") to " << ranks.size() << " rank"
                << (ranks.size() == 1 ? "" : "s")
                << "; they stop after the same step and rank 0 saves a checkpoint (send it again "
                   "to stop at once)"
                << std::endl;
      ::killpg(group, signal);
    }
    int status = 0;
    const pid_t pid = ::waitpid(-group, &status, WNOHANG);
    if (pid > 0) {
      const int rank = ranks[pid];
      ranks.erase(pid);
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      // Interrupted ranks agreed to stop after the same step; the others follow, and rank 0 may
      // still be writing the checkpoint, so nobody is hurried.
      const bool interrupted = WIFEXITED(status) && WEXITSTATUS(status) == kExitInterrupted;
      if (interrupted && !stopping) {
        result = kExitInterrupted;
      } else if (failed && !stopping) {
        result = ExitCode(status);
        stopping = true;
        std::cerr << "engine run: rank " << rank << " (pid " << pid << ") "
                  << DescribeExitStatus(status);
        if (!ranks.empty()) {
          std::cerr << "; stopping the other " << ranks.size() << " rank"
                    << (ranks.size() == 1 ? "" : "s");
          ::killpg(group, SIGTERM);
          deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        }
        std::cerr << std::endl;
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;  // no children left
    if (stopping && std::chrono::steady_clock::now() > deadline) {
      ::killpg(group, SIGKILL);
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace

int LaunchRanks(int nproc, const std::vector<std::string>& run_args) {
  if (std::getenv("WORLD_SIZE") != nullptr) {
    std::cerr << "engine run: --nproc starts the ranks itself, but WORLD_SIZE is already set (by "
                 "torchrun or Slurm?); use one or the other\n";
    return kExitUsage;
  }
  const PortChoice port = ChooseMasterPort();
  if (port.exit_code != kExitOk) return port.exit_code;
  RecordStopSignals();
  RankGroup ranks;
  if (!StartRanks(nproc, port.port, run_args, &ranks)) return kExitFailure;
  return SuperviseRanks(ranks);
}

}  // namespace engine::cli
