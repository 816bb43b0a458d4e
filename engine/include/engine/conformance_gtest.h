// The conformance suite as GoogleTest value-parameterised tests, for plugin authors' own test
// binaries. Link `Engine::conformance` (or `engine_conformance` in the engine's tree) and
// instantiate the suite for your library:
//
//   #include "engine/conformance_gtest.h"
//   using engine::conformance::PluginConformanceTest;
//   INSTANTIATE_TEST_SUITE_P(
//       MyLoader, PluginConformanceTest,
//       ::testing::Values(engine::conformance::Target{"path/to/engine_my_loader.so",
//                                                     "path/to/options.pbtxt"}));
//
// engine_add_conformance_test() in EnginePlugin.cmake writes this for you. Each check runs in a
// child process (a crash fails the check, not the test binary). A check that does not apply to the
// plugin's kind, or needs options it was not given, is skipped with the reason.
#pragma once

#include <gtest/gtest.h>

#include <ostream>

#include "engine/conformance.h"

namespace engine::conformance {

class PluginConformanceTest : public ::testing::TestWithParam<Target> {
 protected:
  // Runs `check` isolated and turns its outcome into the test's.
  void Expect(const std::string& check);
};

inline void PrintTo(const Target& target, std::ostream* out) {
  *out << target.library << (target.options_file.empty() ? "" : " with " + target.options_file);
}

}  // namespace engine::conformance
