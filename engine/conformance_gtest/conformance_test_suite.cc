// The TEST_Ps of engine/conformance_gtest.h; a shared library, so they register when it loads.
#include "engine/conformance_gtest.h"

namespace engine::conformance {

void PluginConformanceTest::Expect(const std::string& check) {
  const CheckResult result = RunIsolated(check, GetParam());
  switch (result.outcome) {
    case Outcome::kPass:
      SUCCEED() << result.detail;
      break;
    case Outcome::kSkip:
      GTEST_SKIP() << result.detail;
      break;
    case Outcome::kFail:
      ADD_FAILURE() << check << ": " << result.detail;
      break;
  }
}

TEST_P(PluginConformanceTest, Manifest) { Expect("manifest"); }
TEST_P(PluginConformanceTest, OptionsSchema) { Expect("options_schema"); }
TEST_P(PluginConformanceTest, BadOptions) { Expect("bad_options"); }
TEST_P(PluginConformanceTest, DataContract) { Expect("data_contract"); }
TEST_P(PluginConformanceTest, ModelContract) { Expect("model_contract"); }
TEST_P(PluginConformanceTest, PrecisionContract) { Expect("precision_contract"); }
TEST_P(PluginConformanceTest, CallbackContract) { Expect("callback_contract"); }

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PluginConformanceTest);

}  // namespace engine::conformance
