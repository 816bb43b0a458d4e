// Runs a command and captures what it printed and how it ended, for tests that drive `engine`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace engine::testing {

struct CommandResult {
  int exit_code = -1;  // the exit status, or 128 + signal when killed by one
  std::string out;
  std::string err;
  // The command's peak resident memory (wait4's ru_maxrss). Linux counts in it what this process
  // held when it forked, so compare two commands' peaks, not one with zero.
  int64_t peak_rss_bytes = 0;
};

// Runs `argv[0]` with `argv` in `working_dir` (empty: the current one). `env` entries are added to
// (or, with an empty value, removed from) the environment.
CommandResult RunCommand(const std::vector<std::string>& argv, const std::string& working_dir = "",
                         const std::map<std::string, std::string>& env = {});

// RunCommand on the built `engine` binary with ENGINE_PLUGIN_PATH cleared.
CommandResult RunEngine(const std::vector<std::string>& args, const std::string& working_dir = "",
                        std::map<std::string, std::string> env = {});

}  // namespace engine::testing
