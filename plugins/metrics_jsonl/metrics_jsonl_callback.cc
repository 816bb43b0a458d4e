// The `metrics_jsonl` callback: one JSON object per event, appended to a file, flushed per line, so
// the file can be followed while training and read by any tool. A stage_begin line carries the
// stage's plan.
//
//   {"event":"step_end","time":1795000000.1,"pipeline":"p","stage":"train","step":10,"epoch":0,
//    "elapsed_seconds":0.5,"metrics":{"loss":0.41,"lr":0.003},"rss_bytes":...}
// Step and stage ends carry the process's memory: resident bytes, and on a GPU the bytes allocated
// now and at most so far (cuda_allocated_bytes, cuda_peak_allocated_bytes).
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/callback.h"
#include "engine/json_text.h"
#include "metrics_jsonl_options.pb.h"

namespace engine::plugins {
namespace {

double UnixTime() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

class MetricsJsonl : public Callback {
 public:
  MetricsJsonl(std::filesystem::path path, uint32_t every_steps)
      : path_(std::move(path)), every_steps_(std::max<uint32_t>(1, every_steps)) {}

  Status OnEvent(const Event& e, CallbackActions& /*actions*/) override {
    if (e.type == EventType::kStepEnd && e.step % every_steps_ != 0 && e.step != e.total_steps) {
      return Status::Ok();
    }
    if (!out_.is_open()) {
      std::error_code ec;
      std::filesystem::create_directories(path_.parent_path(), ec);
      out_.open(path_, std::ios::app);
      if (!out_) {
        return IoError("metrics_jsonl cannot open '" + path_.string() +
                       "': " + std::strerror(errno));
      }
    }
    nlohmann::json line = {{"event", std::string(EventTypeName(e.type))},
                           {"time", UnixTime()},
                           {"pipeline", e.pipeline}};
    if (!e.stage.empty()) {
      line["stage"] = e.stage;
      line["step"] = e.step;
      line["total_steps"] = e.total_steps;
      line["epoch"] = e.epoch;
    }
    line["elapsed_seconds"] = e.elapsed_seconds;
    if (!e.metrics.empty()) line["metrics"] = e.metrics;
    if (e.type == EventType::kStepEnd || e.type == EventType::kStageEnd) {
      line["rss_bytes"] = e.memory.rss_bytes;
      line["peak_rss_bytes"] = e.memory.peak_rss_bytes;
      if (e.memory.cuda) {
        line["cuda_allocated_bytes"] = e.memory.cuda_allocated_bytes;
        line["cuda_peak_allocated_bytes"] = e.memory.cuda_peak_allocated_bytes;
      }
    }
    if (!e.path.empty()) line["path"] = e.path;
    if (!e.plan_json.empty()) line["plan"] = nlohmann::json::parse(e.plan_json, nullptr, false);
    if (!e.message.empty()) line["message"] = e.message;
    out_ << JsonText(line) << "\n";
    out_.flush();
    if (!out_) return IoError("metrics_jsonl cannot write '" + path_.string() + "'");
    return Status::Ok();
  }

 private:
  std::filesystem::path path_;
  uint32_t every_steps_;
  std::ofstream out_;
};

class MetricsJsonlPlugin : public CallbackPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return MetricsJsonlOptions::default_instance();
  }

  StatusOr<std::unique_ptr<Callback>> Create(const google::protobuf::Message& message,
                                             const CallbackContext& context) const override {
    const auto& options = OptionsAs<MetricsJsonlOptions>(message);
    return std::unique_ptr<Callback>(new MetricsJsonl(
        context.OutputPath(options.path(), "metrics.jsonl"), options.every_steps()));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("metrics_jsonl", ENGINE_KIND_CALLBACK, "0.1.0",
              "appends every event (metrics, evaluations, checkpoints, memory) as a JSON line",
              engine::plugins::MetricsJsonlPlugin)
