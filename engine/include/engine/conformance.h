// The plugin conformance suite: checks that a plugin library behaves as the engine relies on, for
// plugin authors and for the built-in plugins alike.
//
//   engine conformance path/to/libfoo.so [--options options.pbtxt] [--format=json]
//
// or, from a GoogleTest binary, engine/conformance_gtest.h. Every check runs in a child process, so
// a plugin that crashes (a segfault in its factory, an abort in its static initialisers) fails that
// check and nothing else.
//
// Checks for every plugin: the manifest and registration; the options schema and its defaults; bad
// option values rejected with a status, never a crash or an escaped exception. Per kind: data
// loaders give batches that match their spec, reproducibly; model loaders round-trip their weights,
// and their census matches their tensors; precision policies make plans that hold the invariants,
// keep the context on a worker thread (F4) and give the optimizer gradients of its own dtype;
// callbacks take every event without failing.
#pragma once

#include <string>
#include <vector>

namespace engine::conformance {

struct Target {
  // The plugin library.
  std::string library;
  // A file holding the plugin's options in protobuf text format (just the fields: `path: "x"`);
  // empty for the defaults. Relative paths in the options resolve against the file's directory.
  std::string options_file;
};

enum class Outcome { kPass, kFail, kSkip };

struct CheckResult {
  std::string check;
  Outcome outcome = Outcome::kFail;
  // The plugin's kind as its manifest says ("data_loader", ...), when the library loaded.
  std::string plugin_kind;
  // What was verified, or why it failed or was skipped.
  std::string detail;
};

// The checks, in the order they run: "manifest", "options_schema", "bad_options", then the kind's
// contract ("data_contract", "model_contract", "precision_contract", "callback_contract").
std::vector<std::string> CheckNames();

// Runs one check in this process. Use RunIsolated unless the plugin is trusted.
CheckResult RunCheck(const std::string& check, const Target& target);

// Runs one check in a child process; a crash, a hang (`timeout_seconds`) or an exit without a
// result is a failure of the check.
CheckResult RunIsolated(const std::string& check, const Target& target, int timeout_seconds = 300);

// The checks that apply to the plugin (the common ones and its kind's contract), each isolated.
// When "manifest" fails, the rest are not run.
std::vector<CheckResult> RunAll(const Target& target);

// The contract check of a kind ("data_loader" -> "data_contract"); empty when the kind has none.
std::string ContractCheckFor(const std::string& plugin_kind);

const char* OutcomeName(Outcome outcome);

}  // namespace engine::conformance
