#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/callback.h"
#include "plugin_test_util.h"

namespace engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const CallbackPlugin& Progress() {
  return testing::BuiltinPlugin<CallbackPlugin>(PluginKind::kCallback, "progress");
}

class NoActions : public CallbackActions {
 public:
  void RequestStop(const std::string&) override {}
  void RequestCheckpoint() override {}
};

std::string Drive(const std::string& options, int total) {
  NoActions actions;
  auto callback = Progress().Create(*testing::Options(Progress(), options), CallbackContext());
  EXPECT_TRUE(callback.ok());
  ::testing::internal::CaptureStderr();
  Event e;
  e.stage = "train";
  e.total_steps = total;
  e.type = EventType::kStageBegin;
  EXPECT_TRUE((*callback)->OnEvent(e, actions).ok());
  for (int step = 1; step <= total; ++step) {
    e.type = EventType::kStepEnd;
    e.step = step;
    e.elapsed_seconds = step * 0.5;
    e.metrics = {{"loss", 1.0 / step}};
    EXPECT_TRUE((*callback)->OnEvent(e, actions).ok());
  }
  e.type = EventType::kEval;
  e.metrics = {{"eval/accuracy", 0.97}};
  EXPECT_TRUE((*callback)->OnEvent(e, actions).ok());
  e.type = EventType::kStageEnd;
  EXPECT_TRUE((*callback)->OnEvent(e, actions).ok());
  return ::testing::internal::GetCapturedStderr();
}

TEST(ProgressTest, PlainLinesAboutTenPerStage) {
  const std::string out = Drive("mode: LINES", 100);
  EXPECT_THAT(out, HasSubstr("stage 'train': 100 steps\n"));
  EXPECT_THAT(out, HasSubstr("stage 'train' step 10/100 loss 0.1000 2.0 steps/s ETA 0:45\n"));
  EXPECT_THAT(out, HasSubstr("stage 'train' step 100/100 loss 0.0100 2.0 steps/s ETA 0:00\n"));
  EXPECT_THAT(out, HasSubstr("stage 'train' step 100/100 eval: eval/accuracy 0.9700\n"));
  EXPECT_THAT(out, Not(HasSubstr("step 11/100")));
  EXPECT_THAT(out, Not(HasSubstr("\r")));
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1 + 10 + 1);
}

TEST(ProgressTest, EveryStepsOption) {
  const std::string out = Drive("mode: LINES every_steps: 25", 100);
  EXPECT_THAT(out, HasSubstr("step 25/100"));
  EXPECT_THAT(out, Not(HasSubstr("step 10/100")));
}

TEST(ProgressTest, BarRedrawsInPlace) {
  const std::string out = Drive("mode: BAR bar_width: 10", 4);
  EXPECT_THAT(out, HasSubstr("\rtrain [##########] step 4/4 loss 0.2500 2.0 steps/s ETA 0:00"));
  EXPECT_THAT(out, HasSubstr("\nstage 'train' step 4/4 eval"));
}

TEST(ProgressTest, BarWidthIsValidated) {
  OptionErrors errors;
  Progress().ValidateOptions(*testing::Options(Progress(), "bar_width: 500"), &errors);
  ASSERT_EQ(errors.entries().size(), 1u);
  EXPECT_EQ(errors.entries()[0].field_path, "bar_width");
}

}  // namespace
}  // namespace engine
