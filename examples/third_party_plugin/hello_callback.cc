// The smallest useful plugin: a callback that greets each stage and reports its final metrics.
#include <cstdio>

#include "engine/callback.h"
#include "hello_options.pb.h"

namespace {

class HelloCallback : public engine::Callback {
 public:
  explicit HelloCallback(std::string greeting) : greeting_(std::move(greeting)) {}

  engine::Status OnEvent(const engine::Event& event, engine::CallbackActions& actions) override {
    if (event.type == engine::EventType::kStageBegin) {
      std::printf("%s, stage '%s'\n", greeting_.c_str(), event.stage.c_str());
    }
    if (event.type == engine::EventType::kStageEnd) {
      for (const auto& [name, value] : event.metrics) {
        std::printf("stage '%s' ended with %s = %.4f\n", event.stage.c_str(), name.c_str(), value);
      }
    }
    return engine::Status::Ok();
  }

 private:
  std::string greeting_;
};

class HelloPlugin : public engine::CallbackPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return hello::HelloOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& options,
                       engine::OptionErrors* errors) const override {
    if (engine::OptionsAs<hello::HelloOptions>(options).greeting().empty()) {
      errors->Add("greeting", "must not be empty");
    }
  }

  engine::StatusOr<std::unique_ptr<engine::Callback>> Create(
      const google::protobuf::Message& options,
      const engine::CallbackContext& context) const override {
    return std::unique_ptr<engine::Callback>(
        new HelloCallback(engine::OptionsAs<hello::HelloOptions>(options).greeting()));
  }
};

}  // namespace

ENGINE_PLUGIN("hello", ENGINE_KIND_CALLBACK, "1.0.0", "greets every stage", HelloPlugin)
