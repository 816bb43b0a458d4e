// The `engine` command: check and run staged fine-tuning pipelines, and inspect plugins.
#include <gflags/gflags.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/allocator.h"
#include "core/logging.h"
#include "engine/version.h"

namespace {

const char kUsage[] = R"(usage: engine <command> [arguments]

commands:
  check PIPELINE.pbtxt     validate a pipeline and print the plan of every stage
  run PIPELINE.pbtxt       check, then train stage by stage
  plugins                  list the installed plugins
  plugins describe NAME    a plugin's options, defaults and a snippet for a stage
  conformance PLUGIN.so    check that a plugin library behaves as the engine relies on
  help [COMMAND]           this text, or a command's

`engine COMMAND --help` describes each command. Add -v (or --verbose) for log lines.
)";

}  // namespace

int main(int argc, char** argv) {
  engine::ConfigureAllocatorForTraining();
  std::vector<std::string> args;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-v") == 0 || std::strcmp(argv[i], "--verbose") == 0) {
      verbose = true;
    } else if (std::strcmp(argv[i], "--version") == 0) {
      std::cout << "engine " << ENGINE_VERSION << "\n";
      return 0;
    } else {
      args.emplace_back(argv[i]);
    }
  }
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = verbose ? google::GLOG_INFO : google::GLOG_WARNING;
  google::InitGoogleLogging(argv[0]);

  using engine::cli::kExitUsage;
  if (args.empty()) {
    std::cerr << kUsage;
    return kExitUsage;
  }
  const std::string command = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "check") return engine::cli::CheckCommand(rest);
  if (command == "run") return engine::cli::RunCommand(rest);
  if (command == "plugins") return engine::cli::PluginsCommand(rest);
  if (command == "conformance") return engine::cli::ConformanceCommand(rest);
  if (command == "help" || command == "-h" || command == "--help") {
    if (rest.empty()) {
      std::cout << kUsage;
    } else if (rest[0] == "check") {
      std::cout << engine::cli::CheckHelp();
    } else if (rest[0] == "run") {
      std::cout << engine::cli::RunHelp();
    } else if (rest[0] == "plugins") {
      std::cout << engine::cli::PluginsHelp();
    } else if (rest[0] == "conformance") {
      std::cout << engine::cli::ConformanceHelp();
    } else {
      std::cerr << "engine help: no command '" << rest[0] << "'\n\n" << kUsage;
      return kExitUsage;
    }
    return 0;
  }
  std::cerr << "engine: unknown command '" << command << "'\n\n" << kUsage;
  return kExitUsage;
}
