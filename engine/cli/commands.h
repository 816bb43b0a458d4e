// The subcommands of the `engine` tool. Each takes the arguments after its name and returns the
// exit status: 0 success, 1 the pipeline is invalid or the run failed, 2 the command line is wrong.
#pragma once

#include <string>
#include <vector>

namespace engine::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
// 128 + SIGINT, as a shell reports a command stopped by Ctrl-C.
inline constexpr int kExitInterrupted = 130;

int CheckCommand(const std::vector<std::string>& args);
int RunCommand(const std::vector<std::string>& args);
int PluginsCommand(const std::vector<std::string>& args);
int ConformanceCommand(const std::vector<std::string>& args);

// Help texts, shared by `engine help COMMAND` and `engine COMMAND --help`.
std::string CheckHelp();
std::string RunHelp();
std::string PluginsHelp();
std::string ConformanceHelp();

}  // namespace engine::cli
