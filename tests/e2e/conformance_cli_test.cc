// `engine conformance` as a plugin author runs it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "testing/subprocess.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

std::string Builtin(const std::string& name) {
  return std::string(testing::kBuiltinPluginDir) + "/engine_" + name + ".so";
}
std::string Fixture(const std::string& name) {
  return std::string(testing::kTestPluginDir) + "/" + name + "/engine_" + name + ".so";
}

TEST(ConformanceCliTest, ABuiltinPluginPasses) {
  auto r = testing::RunEngine(
      {"conformance", Builtin("digits"), "--options",
       std::string(testing::kBinaryDir) + "/tests/testing/digits_options.pbtxt"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("  PASS  manifest           plugin 'digits' (data loader) 0.1.0"));
  EXPECT_THAT(r.out, HasSubstr("  PASS  data_contract      features f32[64], labels i64[] (10 "
                               "classes); 1,438 train / 359 eval"));
  EXPECT_THAT(r.out, HasSubstr("4 checks: 4 passed, 0 failed, 0 skipped"));
}

TEST(ConformanceCliTest, WithoutRequiredOptionsTheContractIsSkipped) {
  auto r = testing::RunEngine({"conformance", Builtin("digits")});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("SKIP  data_contract      needs --options: the defaults do not "
                               "validate: path: is required"));
}

TEST(ConformanceCliTest, ACrashingPluginFailsAndTheToolReportsIt) {
  auto r = testing::RunEngine({"conformance", Fixture("misbehaving_loader"), "--format=json"});
  EXPECT_EQ(r.exit_code, 1);
  auto report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report["kind"], "data_loader");
  EXPECT_EQ(report["failed"], 1);
  EXPECT_EQ(report["passed"], 3);
  const auto& bad = report["checks"][2];
  EXPECT_EQ(bad["check"], "bad_options");
  EXPECT_EQ(bad["outcome"], "FAIL");
  EXPECT_THAT(bad["detail"].get<std::string>(),
              HasSubstr("crashed (Segmentation fault) while the check ran the plugin's code; it "
                        "printed: "));
  EXPECT_THAT(bad["detail"].get<std::string>(),
              HasSubstr("bad_options: trying misbehaviour = SEGFAULT_IN_OPEN"));
}

TEST(ConformanceCliTest, NotAPluginFailsTheManifest) {
  auto r = testing::RunEngine({"conformance", Fixture("not_a_library")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("  FAIL  manifest           cannot load plugin library"));
  EXPECT_THAT(r.out, HasSubstr("1 checks: 0 passed, 1 failed, 0 skipped"));
}

TEST(ConformanceCliTest, Usage) {
  EXPECT_EQ(testing::RunEngine({"conformance"}).exit_code, 2);
  EXPECT_EQ(testing::RunEngine({"conformance", "x.so", "--format=xml"}).exit_code, 2);
  auto help = testing::RunEngine({"conformance", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("usage: engine conformance PLUGIN.so"));
}

}  // namespace
}  // namespace engine
