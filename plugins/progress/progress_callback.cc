// The `progress` callback: a bar with step, loss, steps/s and ETA on a terminal; plain periodic
// lines otherwise. Writes to stderr, so a plan or results on stdout stay clean.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "engine/callback.h"
#include "progress_options.pb.h"

namespace engine::plugins {
namespace {

std::string Duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "--:--";
  const long total = static_cast<long>(seconds + 0.5);
  char buffer[32];
  if (total >= 3600) {
    std::snprintf(buffer, sizeof(buffer), "%ld:%02ld:%02ld", total / 3600, (total / 60) % 60,
                  total % 60);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%ld:%02ld", total / 60, total % 60);
  }
  return buffer;
}

class ProgressCallback : public Callback {
 public:
  ProgressCallback(const ProgressOptions& options, bool terminal)
      : bar_(options.mode() == ProgressOptions::BAR ||
             (options.mode() == ProgressOptions::AUTO && terminal)),
        every_steps_(options.every_steps()),
        bar_width_(options.bar_width()) {}

  Status OnEvent(const Event& e, CallbackActions& /*actions*/) override {
    switch (e.type) {
      case EventType::kStageBegin:
        std::fprintf(stderr, "stage '%s': %lld steps\n", e.stage.c_str(),
                     static_cast<long long>(e.total_steps));
        last_draw_ = {};
        break;
      case EventType::kStepEnd:
        Step(e);
        break;
      case EventType::kEval: {
        EndBar();
        std::string line = "stage '" + e.stage + "' step " + std::to_string(e.step) + "/" +
                           std::to_string(e.total_steps) + " eval:";
        for (const auto& [name, value] : e.metrics) {
          char text[64];
          std::snprintf(text, sizeof(text), " %s %.4f", name.c_str(), value);
          line += text;
        }
        std::fprintf(stderr, "%s\n", line.c_str());
        break;
      }
      case EventType::kCheckpointSaved:
        EndBar();
        std::fprintf(stderr, "stage '%s' step %lld: checkpoint %s\n", e.stage.c_str(),
                     static_cast<long long>(e.step), e.path.c_str());
        break;
      case EventType::kStageEnd:
      case EventType::kError:
        EndBar();
        break;
      default:
        break;
    }
    std::fflush(stderr);
    return Status::Ok();
  }

 private:
  void Step(const Event& e) {
    const double rate = e.elapsed_seconds > 0 ? e.step / e.elapsed_seconds : 0;
    const double eta = rate > 0 ? (e.total_steps - e.step) / rate : -1;
    const double loss = e.metrics.count("loss") ? e.metrics.at("loss") : 0;
    char stats[160];
    std::snprintf(stats, sizeof(stats), "step %lld/%lld loss %.4f %.1f steps/s ETA %s",
                  static_cast<long long>(e.step), static_cast<long long>(e.total_steps), loss, rate,
                  Duration(eta).c_str());
    const bool last = e.step >= e.total_steps;
    if (bar_) {
      const auto now = std::chrono::steady_clock::now();
      if (!last && now - last_draw_ < std::chrono::milliseconds(100)) return;
      last_draw_ = now;
      const uint32_t width = std::max<uint32_t>(10, std::min<uint32_t>(bar_width_, 200));
      const uint32_t filled =
          e.total_steps > 0 ? static_cast<uint32_t>(width * e.step / e.total_steps) : 0;
      std::string bar(filled, '#');
      bar.append(width - std::min(filled, width), '.');
      std::fprintf(stderr, "\r%s [%s] %s\033[K", e.stage.c_str(), bar.c_str(), stats);
      drawing_ = true;
      return;
    }
    int64_t every = every_steps_;
    if (every == 0) every = std::max<int64_t>(1, e.total_steps / 10);
    if (e.step % every == 0 || last) {
      std::fprintf(stderr, "stage '%s' %s\n", e.stage.c_str(), stats);
    }
  }

  void EndBar() {
    if (drawing_) std::fprintf(stderr, "\n");
    drawing_ = false;
  }

  bool bar_;
  int64_t every_steps_;
  uint32_t bar_width_;
  bool drawing_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

class ProgressPlugin : public CallbackPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return ProgressOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& message,
                       OptionErrors* errors) const override {
    const auto& options = OptionsAs<ProgressOptions>(message);
    if (options.bar_width() < 10 || options.bar_width() > 200) {
      errors->Add("bar_width",
                  "must be in 10..200 (got " + std::to_string(options.bar_width()) + ")");
    }
  }

  StatusOr<std::unique_ptr<Callback>> Create(
      const google::protobuf::Message& message,
      const engine::CallbackContext& /*context*/) const override {
    return std::unique_ptr<Callback>(
        new ProgressCallback(OptionsAs<ProgressOptions>(message), ::isatty(2) == 1));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("progress", ENGINE_KIND_CALLBACK, "0.1.0",
              "a progress bar (or plain lines when not on a terminal) with loss, steps/s and ETA",
              engine::plugins::ProgressPlugin)
