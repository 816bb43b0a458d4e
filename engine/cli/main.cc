// The `engine` command: check and run staged fine-tuning pipelines, and inspect plugins.
#include <gflags/gflags.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/allocator.h"
#include "core/logging.h"
#include "engine/untrusted_file.h"
#include "engine/version.h"

namespace engine::cli {

void PrintNotes(const std::vector<std::string>& notes) {
  for (const std::string& note : notes) std::cerr << "engine: " << note << "\n";
}

const std::vector<Command>& Commands() {
  static const std::vector<Command> commands = {
      {"check",
       {{"check PIPELINE.pbtxt", "validate a pipeline and print the plan of every stage"}},
       CheckCommand,
       CheckHelp},
      {"run", {{"run PIPELINE.pbtxt", "check, then train stage by stage"}}, RunCommand, RunHelp},
      {"eval",
       {{"eval PIPELINE.pbtxt", "evaluate a trained stage's checkpoint without training"}},
       EvalCommand,
       EvalHelp},
      {"generate",
       {{"generate SOURCE --prompt=TEXT", "continue prompts with a model directory or a stage"}},
       GenerateCommand,
       GenerateHelp},
      {"export",
       {{"export SOURCE --to=DIR --format=hf|peft|bnb4",
         "a trained model for transformers, PEFT or bitsandbytes"}},
       ExportCommand,
       ExportHelp},
      {"preview",
       {{"preview PIPELINE.pbtxt", "a stage's first examples decoded, loss tokens marked"}},
       PreviewCommand,
       PreviewHelp},
      {"plugins",
       {{"plugins", "list the installed plugins"},
        {"plugins describe NAME", "a plugin's options, defaults and a snippet for a stage"}},
       PluginsCommand,
       PluginsHelp},
      {"conformance",
       {{"conformance PLUGIN.so", "check that a plugin library behaves as the engine relies on"}},
       ConformanceCommand,
       ConformanceHelp},
      {"verify",
       {{"verify DIR", "check every checkpoint under DIR against its manifest's hashes"}},
       VerifyCommand,
       VerifyHelp},
  };
  return commands;
}

namespace {

const Command* FindCommand(const std::string& name) {
  for (const Command& command : Commands()) {
    if (name == command.name) return &command;
  }
  return nullptr;
}

std::string Usage() {
  std::string text = "usage: engine <command> [arguments]\n\ncommands:\n";
  auto line = [&text](const std::string& synopsis, const std::string& summary) {
    text += "  " + synopsis + std::string(synopsis.size() < 25 ? 25 - synopsis.size() : 1, ' ') +
            summary + "\n";
  };
  for (const Command& command : Commands()) {
    for (const Command::Usage& usage : command.usage) line(usage.synopsis, usage.summary);
  }
  line("help [COMMAND]", "this text, or a command's");
  return text +
         "\n`engine COMMAND --help` describes each command. Add -v (or --verbose) for log lines.\n";
}

int Help(const std::vector<std::string>& rest) {
  if (rest.empty()) {
    std::cout << Usage();
    return kExitOk;
  }
  if (const Command* command = FindCommand(rest[0])) {
    std::cout << command->help();
    return kExitOk;
  }
  std::cerr << "engine help: no command '" << rest[0] << "'\n\n" << Usage();
  return kExitUsage;
}

}  // namespace
}  // namespace engine::cli

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

  namespace cli = engine::cli;
  if (args.empty()) {
    std::cerr << cli::Usage();
    return cli::kExitUsage;
  }
  const std::string name = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (name == "help" || name == "-h" || name == "--help") return cli::Help(rest);
  if (const cli::Command* command = cli::FindCommand(name)) {
    // A malformed ENGINE_FILE_LIMITS would fail the first file read; say so before any work.
    if (const engine::Status limits = engine::FileLimitsSummary().status(); !limits.ok()) {
      std::cerr << "engine " << name << ": " << limits.message() << "\n";
      return cli::kExitUsage;
    }
    return command->run(rest);
  }
  std::cerr << "engine: unknown command '" << name << "'\n\n" << cli::Usage();
  return cli::kExitUsage;
}
