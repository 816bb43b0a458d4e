// The `checkpoint_every` callback: asks for a periodic checkpoint every N steps and/or every T
// minutes of wall time (default: every 30 minutes; the pipeline's schedule.checkpoint_every_steps
// counts steps only). The
// stage's checkpoint settings (keep_last) apply to them.
#include <chrono>

#include "checkpoint_every_options.pb.h"
#include "engine/callback.h"

namespace engine::plugins {
namespace {

class CheckpointEvery : public Callback {
 public:
  explicit CheckpointEvery(const CheckpointEveryOptions& options) : options_(options) {}

  Status OnEvent(const Event& e, CallbackActions& actions) override {
    if (e.type == EventType::kStageBegin) {
      last_ = std::chrono::steady_clock::now();
      return Status::Ok();
    }
    if (e.type != EventType::kStepEnd || e.step >= e.total_steps) return Status::Ok();
    const auto now = std::chrono::steady_clock::now();
    const bool by_steps = options_.steps() > 0 && e.step % options_.steps() == 0;
    const bool by_time =
        options_.minutes() > 0 &&
        std::chrono::duration<double, std::ratio<60>>(now - last_).count() >= options_.minutes();
    if (by_steps || by_time) {
      actions.RequestCheckpoint();
      last_ = now;
    }
    return Status::Ok();
  }

 private:
  CheckpointEveryOptions options_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

class CheckpointEveryPlugin : public CallbackPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return CheckpointEveryOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& message,
                       OptionErrors* errors) const override {
    const auto& options = OptionsAs<CheckpointEveryOptions>(message);
    if (!(options.minutes() >= 0)) errors->Add("minutes", "must be >= 0");
    if (options.steps() == 0 && options.minutes() == 0) {
      errors->Add("", "set steps or minutes (or both); with neither it never checkpoints");
    }
  }

  StatusOr<std::unique_ptr<Callback>> Create(const google::protobuf::Message& message,
                                             const CallbackContext& /*context*/) const override {
    return std::unique_ptr<Callback>(
        new CheckpointEvery(OptionsAs<CheckpointEveryOptions>(message)));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("checkpoint_every", ENGINE_KIND_CALLBACK, "0.1.0",
              "asks for checkpoints every N steps or every T minutes",
              engine::plugins::CheckpointEveryPlugin)
