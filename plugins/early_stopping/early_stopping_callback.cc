// The `early_stopping` callback: ends a stage when an evaluation metric has not improved for
// `patience` evaluations. The stage then finishes as usual: final evaluation, final checkpoint, and
// the reason in the checkpoint's manifest. Needs evaluations during the stage
// (schedule.eval_every_steps).
#include <cmath>
#include <cstdio>
#include <limits>

#include "early_stopping_options.pb.h"
#include "engine/callback.h"
#include "engine/format.h"

namespace engine::plugins {
namespace {

class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(const EarlyStoppingOptions& options)
      : options_(options),
        minimize_(options.mode() == EarlyStoppingOptions::MIN ||
                  (options.mode() == EarlyStoppingOptions::AUTO &&
                   options.metric().find("loss") != std::string::npos)) {}

  Status OnEvent(const Event& e, CallbackActions& actions) override {
    if (e.type == EventType::kStageBegin) {
      best_ = std::numeric_limits<double>::quiet_NaN();
      waited_ = 0;
      return Status::Ok();
    }
    if (e.type != EventType::kEval) return Status::Ok();
    auto it = e.metrics.find(options_.metric());
    if (it == e.metrics.end()) {
      std::string known;
      for (const auto& [name, value] : e.metrics) known += (known.empty() ? "" : ", ") + name;
      return InvalidArgumentError("early_stopping watches '" + options_.metric() +
                                  "', which the evaluation does not report (it reports: " + known +
                                  ")");
    }
    const double value = it->second;
    const bool improved = std::isnan(best_) || (minimize_ ? value < best_ - options_.min_delta()
                                                          : value > best_ + options_.min_delta());
    if (improved) {
      best_ = value;
      best_step_ = e.step;
      waited_ = 0;
      return Status::Ok();
    }
    if (++waited_ >= options_.patience()) {
      actions.RequestStop(options_.metric() + " did not improve for " + std::to_string(waited_) +
                          " evaluation(s) (best " + FormatNumber(best_) + " at step " +
                          std::to_string(best_step_) + ")");
    }
    return Status::Ok();
  }

  // "<best> <best_step> <waited>", the best with 17 digits so it reads back exactly.
  std::string SaveState() const override {
    if (std::isnan(best_)) return "";
    char text[96];
    std::snprintf(text, sizeof(text), "%.17g %lld %u", best_, static_cast<long long>(best_step_),
                  waited_);
    return text;
  }

  Status RestoreState(const std::string& state) override {
    double best = 0;
    long long best_step = 0;
    unsigned waited = 0;
    char rest = 0;
    if (std::sscanf(state.c_str(), "%lf %lld %u %c", &best, &best_step, &waited, &rest) != 3) {
      return InvalidArgumentError("early_stopping cannot read its saved state '" + state + "'");
    }
    best_ = best;
    best_step_ = best_step;
    waited_ = waited;
    return Status::Ok();
  }

 private:
  EarlyStoppingOptions options_;
  bool minimize_;
  double best_ = std::numeric_limits<double>::quiet_NaN();
  int64_t best_step_ = 0;
  uint32_t waited_ = 0;
};

class EarlyStoppingPlugin : public CallbackPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return EarlyStoppingOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& message,
                       OptionErrors* errors) const override {
    const auto& options = OptionsAs<EarlyStoppingOptions>(message);
    if (options.patience() == 0) errors->Add("patience", "must be > 0");
    if (!(options.min_delta() >= 0)) errors->Add("min_delta", "must be >= 0");
    if (options.metric().empty()) {
      errors->Add("metric", "must name a metric, e.g. eval/loss");
    } else if (options.metric().rfind("eval/", 0) != 0) {
      // Evaluations report only eval/<name> metrics: any other name would never be seen, and the
      // stage would fail at its first evaluation, after training up to it.
      errors->Add("metric", "'" + options.metric() +
                                "' is never reported by an evaluation; evaluation metrics are "
                                "named eval/<name>: eval/loss, or one the model reports such as "
                                "eval/accuracy");
    }
  }

  StatusOr<std::unique_ptr<Callback>> Create(const google::protobuf::Message& message,
                                             const CallbackContext& /*context*/) const override {
    return std::unique_ptr<Callback>(new EarlyStopping(OptionsAs<EarlyStoppingOptions>(message)));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("early_stopping", ENGINE_KIND_CALLBACK, "0.1.0",
              "ends a stage when an evaluation metric stops improving",
              engine::plugins::EarlyStoppingPlugin)
