#include "core/interrupt.h"

#include <signal.h>

#include <atomic>
#include <cstring>

namespace engine {
namespace {

std::atomic<int> first_signal{0};

void OnSignal(int signal) {
  int expected = 0;
  if (first_signal.compare_exchange_strong(expected, signal)) return;
  // The second signal: the user means it. Restore the default action and deliver it again.
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

}  // namespace

void InstallInterruptHandlers() {
  static_assert(std::atomic<int>::is_always_lock_free,
                "the signal handler needs a lock-free atomic");
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  // Interrupted reads and writes restart: a checkpoint being written is finished, not torn.
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

bool InterruptRequested() { return first_signal.load(std::memory_order_relaxed) != 0; }

std::string InterruptSignalName() {
  switch (first_signal.load(std::memory_order_relaxed)) {
    case 0:
      return "";
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "signal " + std::to_string(first_signal.load());
  }
}

void ClearInterrupt() { first_signal.store(0); }

}  // namespace engine
