// What the conformance checks share (checks.cc: the checks for every plugin and the dispatch;
// contracts.cc: each kind's contract): the plugin under test with the options it is checked with,
// and the verdicts. Internal to the suite; the public interface is engine/conformance.h.
#pragma once

#include <google/protobuf/message.h>

#include <filesystem>
#include <memory>
#include <string>

#include "engine/conformance.h"
#include "engine/plugin.h"
#include "engine/status.h"
#include "plugins/plugin_library.h"

namespace engine::conformance {

inline CheckResult Verdict(Outcome outcome, std::string detail) {
  CheckResult r;
  r.outcome = outcome;
  r.detail = std::move(detail);
  return r;
}
inline CheckResult Pass(std::string detail) { return Verdict(Outcome::kPass, std::move(detail)); }
inline CheckResult Fail(std::string detail) { return Verdict(Outcome::kFail, std::move(detail)); }
inline CheckResult Skip(std::string detail) { return Verdict(Outcome::kSkip, std::move(detail)); }

// The loaded plugin and its options for a target.
struct Subject {
  LoadedPlugin loaded;
  std::unique_ptr<google::protobuf::Message> options;  // the target's options, or the defaults
  std::filesystem::path base_dir;                      // relative option paths resolve here
  bool options_given = false;
};

// "field: message; ..." for a failure's detail.
inline std::string JoinErrors(const OptionErrors& errors) {
  std::string out;
  for (const auto& e : errors.entries()) {
    out +=
        (out.empty() ? "" : "; ") + (e.field_path.empty() ? "" : e.field_path + ": ") + e.message;
  }
  return out;
}

// The options the kind's factory is exercised with: the target's, or the defaults when they
// validate. An error (for a Skip) when neither works.
StatusOr<const google::protobuf::Message*> UsableOptions(const Subject& s);

// Each kind's contract (contracts.cc).
CheckResult DataContract(const Subject& s);
CheckResult ModelContract(const Subject& s);
CheckResult PrecisionContract(const Subject& s);
CheckResult CallbackContract(const Subject& s);

}  // namespace engine::conformance
