// Every built-in plugin passes the conformance suite, run through the GoogleTest form that plugin
// authors link (engine/conformance_gtest.h).
#include <cstring>
#include <filesystem>

#include "engine/conformance_gtest.h"
#include "testing/test_paths.h"

namespace engine::conformance {
namespace {

std::vector<Target> BuiltinTargets() {
  std::vector<Target> targets;
  for (const auto& item : std::filesystem::directory_iterator(engine::testing::kBuiltinPluginDir)) {
    if (item.path().extension() != ".so") continue;
    // Data loaders whose options name a file get them from tests/testing/<name>_options.pbtxt.
    std::string name = item.path().stem().string().substr(std::strlen("engine_"));
    std::string options;
    if (name == "digits" || name == "digits_captions" || name == "text" || name == "chat") {
      options =
          std::string(engine::testing::kBinaryDir) + "/tests/testing/" + name + "_options.pbtxt";
    }
    targets.push_back({item.path().string(), options});
  }
  std::sort(targets.begin(), targets.end(),
            [](const Target& a, const Target& b) { return a.library < b.library; });
  return targets;
}

std::string Name(const ::testing::TestParamInfo<Target>& info) {
  std::string name = std::filesystem::path(info.param.library).stem().string();
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Builtin, PluginConformanceTest, ::testing::ValuesIn(BuiltinTargets()),
                         Name);

}  // namespace
}  // namespace engine::conformance
