#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/arguments.h"
#include "cli/commands.h"
#include "engine/conformance.h"
#include "engine/json_text.h"

namespace engine::cli {

std::string ConformanceHelp() {
  return R"(usage: engine conformance PLUGIN.so [--options OPTIONS.pbtxt] [--format=text|json]

Checks that a plugin library behaves as the engine relies on. Each check runs in a child process,
so a plugin that crashes fails that check and nothing else:

  manifest            the manifest matches this engine and one plugin registers
  options_schema      the options message, its defaults and required fields
  bad_options         unusual values are rejected with a status, never a crash or an exception
  data_contract       data loaders: batches match the spec, bad indices are refused, the same
                      seed gives the same data
  model_contract      model loaders: the census matches the tensors, weights round-trip through
                      safetensors into a second instance that computes the same loss
  precision_contract  precision policies: plans hold the invariants, the captured context gives
                      the same output on a worker thread (F4), the optimizer sees gradients of its
                      own dtype (F6)
  callback_contract   callbacks take every event type without failing

  --options FILE    the plugin's options in protobuf text format (just the fields), for plugins
                    whose defaults are not enough (a required path, say)
  --format=json     {"plugin": ..., "checks": [{"check", "outcome", "detail"}], "passed": ...}

Exit status 0 when no check failed (skipped ones are listed), 1 otherwise, 2 for a wrong command
line.
)";
}

int ConformanceCommand(const std::vector<std::string>& args) {
  Arguments a = ParseArguments(args, {"options", "format"}, {});
  if (a.help) {
    std::cout << ConformanceHelp();
    return kExitOk;
  }
  const std::string format = ReadTextOrJsonFormat(&a);
  if (a.error.empty() && a.positional.size() != 1) a.error = "expected one plugin library";
  if (!a.error.empty()) {
    std::cerr << "engine conformance: " << a.error << "\n\n" << ConformanceHelp();
    return kExitUsage;
  }
  const conformance::Target target{a.positional[0], a.Get("options")};
  const std::vector<conformance::CheckResult> results = conformance::RunAll(target);
  int passed = 0, failed = 0, skipped = 0;
  for (const auto& r : results) {
    if (r.outcome == conformance::Outcome::kPass) ++passed;
    if (r.outcome == conformance::Outcome::kFail) ++failed;
    if (r.outcome == conformance::Outcome::kSkip) ++skipped;
  }
  if (format == "json") {
    nlohmann::json checks = nlohmann::json::array();
    for (const auto& r : results) {
      checks.push_back({{"check", r.check},
                        {"outcome", conformance::OutcomeName(r.outcome)},
                        {"detail", r.detail}});
    }
    std::cout << JsonText({{"library", target.library},
                           {"kind", results.front().plugin_kind},
                           {"checks", checks},
                           {"passed", passed},
                           {"failed", failed},
                           {"skipped", skipped}},
                          2)
              << "\n";
  } else {
    std::cout << "conformance of " << target.library << "\n";
    for (const auto& r : results) {
      std::string name = r.check;
      name.resize(std::max<size_t>(name.size(), 19), ' ');
      std::cout << "  " << conformance::OutcomeName(r.outcome) << "  " << name << r.detail << "\n";
    }
    std::cout << results.size() << " checks: " << passed << " passed, " << failed << " failed, "
              << skipped << " skipped\n";
  }
  return failed == 0 ? kExitOk : kExitFailure;
}

}  // namespace engine::cli
