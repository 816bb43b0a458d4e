// The conformance checks catch each kind of misbehaviour, and a crash costs only the check.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/conformance.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine::conformance {
namespace {

using ::testing::HasSubstr;

std::string ConformanceFixture(const std::string& name) {
  return std::string(engine::testing::kTestPluginDir) + "/" + name + "/engine_" + name + ".so";
}

CheckResult WithMisbehaviour(const std::string& check, const std::string& misbehaviour) {
  static engine::testing::TempDir dir;
  auto options = dir.Write(misbehaviour + ".pbtxt", "misbehaviour: " + misbehaviour + "\n");
  return RunIsolated(check, {ConformanceFixture("misbehaving_loader"), options.string()});
}

TEST(ConformanceChecksTest, EveryOptionValueIsTriedSoAValueThatCrashesFails) {
  auto results = RunAll({ConformanceFixture("misbehaving_loader"), ""});
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[0].plugin_kind, "data_loader");
  EXPECT_EQ(results[0].outcome, Outcome::kPass) << results[0].detail;
  EXPECT_EQ(results[1].outcome, Outcome::kPass) << results[1].detail;
  // Its default behaviour conforms...
  EXPECT_EQ(results[3].check, "data_contract");
  EXPECT_EQ(results[3].outcome, Outcome::kPass) << results[3].detail;
  // ...but one of its option values segfaults, and bad_options tries them all.
  EXPECT_EQ(results[2].check, "bad_options");
  EXPECT_EQ(results[2].outcome, Outcome::kFail);
  EXPECT_THAT(results[2].detail, HasSubstr("crashed (Segmentation fault)"));
}

TEST(ConformanceChecksTest, ASegfaultFailsTheCheckOnly) {
  CheckResult r = WithMisbehaviour("data_contract", "SEGFAULT_IN_OPEN");
  EXPECT_EQ(r.outcome, Outcome::kFail);
  EXPECT_THAT(r.detail, HasSubstr("crashed (Segmentation fault) while the check ran the plugin's "
                                  "code"));
}

TEST(ConformanceChecksTest, ExitingTheProcessIsAFailure) {
  CheckResult r = WithMisbehaviour("data_contract", "EXIT_IN_OPEN");
  EXPECT_EQ(r.outcome, Outcome::kFail);
  EXPECT_THAT(r.detail, HasSubstr("ended (exit status 3) without a result"));
}

TEST(ConformanceChecksTest, BatchesMustMatchTheSpec) {
  CheckResult r = WithMisbehaviour("data_contract", "WRONG_DTYPE");
  EXPECT_EQ(r.outcome, Outcome::kFail);
  EXPECT_EQ(r.detail, "field 'features' is f64, the spec says f32");
}

TEST(ConformanceChecksTest, TheSameSeedMustGiveTheSameData) {
  CheckResult r = WithMisbehaviour("data_contract", "UNSEEDED");
  EXPECT_EQ(r.outcome, Outcome::kFail);
  EXPECT_EQ(r.detail, "the same seed gave different examples (features)");
}

TEST(ConformanceChecksTest, AnExceptionFromValidateOptionsIsAFailure) {
  CheckResult r = WithMisbehaviour("options_schema", "THROW_IN_VALIDATE");
  EXPECT_EQ(r.outcome, Outcome::kFail);
  EXPECT_THAT(r.detail, HasSubstr("an exception escaped ValidateOptions: the fixture throws from "
                                  "ValidateOptions"));
}

TEST(ConformanceChecksTest, BrokenLibrariesFailTheManifestAndStop) {
  auto not_library = RunAll({ConformanceFixture("not_a_library"), ""});
  ASSERT_EQ(not_library.size(), 1u);
  EXPECT_EQ(not_library[0].outcome, Outcome::kFail);
  EXPECT_THAT(not_library[0].detail, HasSubstr("cannot load plugin library"));
  auto wrong_api = RunAll({ConformanceFixture("wrong_api"), ""});
  EXPECT_THAT(wrong_api[0].detail, HasSubstr("API 999"));
  auto throwing = RunAll({ConformanceFixture("throwing_register"), ""});
  EXPECT_THAT(throwing[0].detail, HasSubstr("registration failed"));
}

TEST(ConformanceChecksTest, OptionsFileErrorsNameTheLine) {
  engine::testing::TempDir dir;
  auto bad = dir.Write("bad.pbtxt", "misbehaviour: NONE\nno_such_field: 1\n");
  CheckResult r = RunIsolated("manifest", {ConformanceFixture("misbehaving_loader"), bad.string()});
  EXPECT_EQ(r.outcome, Outcome::kFail);
  EXPECT_THAT(r.detail, HasSubstr("bad.pbtxt:2:"));
  EXPECT_THAT(r.detail, HasSubstr("no_such_field"));
}

}  // namespace
}  // namespace engine::conformance
