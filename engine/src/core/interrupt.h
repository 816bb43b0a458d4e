// Ctrl-C and SIGTERM during `engine run`: the first one asks the training loop to stop after the
// current step and write a checkpoint it can resume from; a second one ends the process at once
// (the default action of that signal), which loses at most the steps since the last checkpoint.
//
// Thread safety: the handler only stores into a lock-free atomic; InterruptRequested may be called
// from any thread.
#pragma once

#include <string>

namespace engine {

// Installs the handlers for SIGINT and SIGTERM. Call once, from the main thread.
void InstallInterruptHandlers();

// Whether a signal arrived since the handlers were installed (or since ClearInterrupt).
bool InterruptRequested();

// "SIGINT" / "SIGTERM": the first signal that arrived; empty when none did.
std::string InterruptSignalName();

// For tests that reuse one process.
void ClearInterrupt();

}  // namespace engine
