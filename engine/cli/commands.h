// The subcommands of the `engine` tool. Each takes the arguments after its name and returns the
// exit status: 0 success, 1 the pipeline is invalid or the run failed, 2 the command line is wrong.
//
// Commands() is the one list of them: main.cc dispatches through it and builds `engine help` from
// it, so a new command is one entry there and one file here.
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
int EvalCommand(const std::vector<std::string>& args);
int GenerateCommand(const std::vector<std::string>& args);
int ExportCommand(const std::vector<std::string>& args);
int PreviewCommand(const std::vector<std::string>& args);
int VerifyCommand(const std::vector<std::string>& args);

// Help texts, shared by `engine help COMMAND` and `engine COMMAND --help`.
std::string CheckHelp();
std::string RunHelp();
std::string PluginsHelp();
std::string ConformanceHelp();
std::string EvalHelp();
std::string GenerateHelp();
std::string ExportHelp();
std::string PreviewHelp();
std::string VerifyHelp();

struct Command {
  struct Usage {
    const char* synopsis;  // "check PIPELINE.pbtxt"
    const char* summary;   // "validate a pipeline and print the plan of every stage"
  };
  const char* name;
  std::vector<Usage> usage;  // the lines `engine help` shows for it
  int (*run)(const std::vector<std::string>& args);
  std::string (*help)();
};

// Every command, in the order `engine help` lists them.
const std::vector<Command>& Commands();

// Prints what loading a pipeline found worth telling (PipelineSession::notes) on stderr.
void PrintNotes(const std::vector<std::string>& notes);

}  // namespace engine::cli
