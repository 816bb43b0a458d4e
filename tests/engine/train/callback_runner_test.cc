#include "train/callback_runner.h"

#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

namespace engine {
namespace {

class Recorder : public Callback {
 public:
  explicit Recorder(int* calls, int fail_from = 1 << 30, bool throw_instead = false)
      : calls_(calls), fail_from_(fail_from), throw_(throw_instead) {}
  Status OnEvent(const Event& event, CallbackActions&) override {
    ++*calls_;
    if (event.step < fail_from_) return Status::Ok();
    if (throw_) throw std::runtime_error("boom");
    return InternalError("bad");
  }

 private:
  int* calls_;
  int fail_from_;
  bool throw_;
};

class NoActions : public CallbackActions {
 public:
  void RequestStop(const std::string&) override {}
  void RequestCheckpoint() override {}
};
NoActions no_actions;

Event Step(int64_t step) {
  Event e;
  e.type = EventType::kStepEnd;
  e.step = step;
  return e;
}

TEST(CallbackRunnerTest, DisableStopsCallingAFailingCallback) {
  int failing = 0, healthy = 0;
  CallbackRunner runner;
  runner.Add("failing", std::make_unique<Recorder>(&failing, 2, true), proto::CallbackRef::DISABLE);
  runner.Add("healthy", std::make_unique<Recorder>(&healthy), proto::CallbackRef::DISABLE);
  for (int step = 1; step <= 5; ++step) EXPECT_TRUE(runner.Dispatch(Step(step), no_actions).ok());
  EXPECT_EQ(failing, 2);
  EXPECT_EQ(healthy, 5);
  EXPECT_EQ(runner.Disabled(), std::vector<std::string>{"failing"});
}

TEST(CallbackRunnerTest, WarnKeepsCalling) {
  int calls = 0;
  CallbackRunner runner;
  runner.Add("noisy", std::make_unique<Recorder>(&calls, 1), proto::CallbackRef::WARN);
  for (int step = 1; step <= 3; ++step) EXPECT_TRUE(runner.Dispatch(Step(step), no_actions).ok());
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(runner.Disabled().empty());
}

TEST(CallbackRunnerTest, FailStageReturnsTheErrorWithContext) {
  int calls = 0;
  CallbackRunner runner;
  runner.Add("strict", std::make_unique<Recorder>(&calls, 2, true), proto::CallbackRef::FAIL_STAGE);
  EXPECT_TRUE(runner.Dispatch(Step(1), no_actions).ok());
  Status s = runner.Dispatch(Step(2), no_actions);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "callback 'strict' on step_end at step 2: boom");
}

// Keeps one string; saving or restoring can be made to fail.
class Stateful : public Callback {
 public:
  Stateful(std::string state, bool throw_on_save = false, bool refuse_restore = false)
      : state_(std::move(state)), throw_(throw_on_save), refuse_(refuse_restore) {}
  Status OnEvent(const Event&, CallbackActions&) override { return Status::Ok(); }
  std::string SaveState() const override {
    if (throw_) throw std::runtime_error("no state today");
    return state_;
  }
  Status RestoreState(const std::string& state) override {
    if (refuse_) return InvalidArgumentError("unreadable");
    state_ = state;
    return Status::Ok();
  }
  std::string state_;

 private:
  bool throw_, refuse_;
};

TEST(CallbackRunnerTest, StatesAreSavedAndRestoredByPositionAndName) {
  int calls = 0;
  CallbackRunner saving;
  saving.Add("plain", std::make_unique<Recorder>(&calls), proto::CallbackRef::DISABLE);
  saving.Add("keeper", std::make_unique<Stateful>("best 0.9"), proto::CallbackRef::DISABLE);
  saving.Add("broken", std::make_unique<Stateful>("x", /*throw_on_save=*/true),
             proto::CallbackRef::DISABLE);
  const auto states = saving.SaveStates();
  EXPECT_EQ(states, (std::map<std::string, std::string>{{"1:keeper", "best 0.9"}}))
      << "no state, or a throwing SaveState, is left out";

  CallbackRunner restoring;
  auto keeper = std::make_unique<Stateful>("");
  Stateful* kept = keeper.get();
  auto refusing = std::make_unique<Stateful>("fresh", false, /*refuse_restore=*/true);
  Stateful* refused = refusing.get();
  restoring.Add("plain", std::make_unique<Recorder>(&calls), proto::CallbackRef::DISABLE);
  restoring.Add("keeper", std::move(keeper), proto::CallbackRef::DISABLE);
  restoring.Add("other", std::move(refusing), proto::CallbackRef::DISABLE);
  restoring.RestoreStates({{"1:keeper", "best 0.9"}, {"2:other", "?"}, {"5:gone", "y"}});
  EXPECT_EQ(kept->state_, "best 0.9");
  EXPECT_EQ(refused->state_, "fresh") << "a refused state leaves the callback as it was";
}

TEST(CallbackRunnerTest, SeveralRunnersKeepTheirStatesApart) {
  CallbackRunner stage, pipeline;
  stage.Add("keeper", std::make_unique<Stateful>("stage's"), proto::CallbackRef::DISABLE);
  pipeline.Add("keeper", std::make_unique<Stateful>("pipeline's"), proto::CallbackRef::DISABLE);
  const auto states = SaveCallbackStates({&stage, &pipeline});
  EXPECT_EQ(states, (std::map<std::string, std::string>{{"0/0:keeper", "stage's"},
                                                        {"1/0:keeper", "pipeline's"}}));

  CallbackRunner stage_again, pipeline_again;
  auto first = std::make_unique<Stateful>(""), second = std::make_unique<Stateful>("");
  Stateful* a = first.get();
  Stateful* b = second.get();
  stage_again.Add("keeper", std::move(first), proto::CallbackRef::DISABLE);
  pipeline_again.Add("keeper", std::move(second), proto::CallbackRef::DISABLE);
  RestoreCallbackStates({&stage_again, &pipeline_again}, states);
  EXPECT_EQ(a->state_, "stage's");
  EXPECT_EQ(b->state_, "pipeline's");
}

}  // namespace
}  // namespace engine
