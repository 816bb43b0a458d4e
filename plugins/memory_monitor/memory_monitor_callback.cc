// The `memory_monitor` callback: resident memory (now and peak) and, with CUDA, the caching
// allocator's statistics, with deltas since the previous report. It reads what the engine measured
// for the event (the operating system's and the allocators' counters); it never walks live objects.
#include <cstdio>

#include "engine/callback.h"
#include "memory_monitor_options.pb.h"

namespace engine::plugins {
namespace {

std::string Megabytes(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MB", static_cast<double>(bytes) / 1e6);
  return text;
}

std::string SignedMegabytes(int64_t bytes) {
  return (bytes >= 0 ? "+" : "-") + Megabytes(bytes >= 0 ? bytes : -bytes);
}

class MemoryMonitor : public Callback {
 public:
  explicit MemoryMonitor(const MemoryMonitorOptions& options) : options_(options) {}

  Status OnEvent(const Event& e, CallbackActions& /*actions*/) override {
    if (e.type == EventType::kStageBegin) {
      last_ = ReadMemoryStats();
      last_step_ = 0;
      return Status::Ok();
    }
    if (e.type != EventType::kStepEnd && e.type != EventType::kStageEnd) return Status::Ok();
    const MemoryStats& m = e.memory;
    if (options_.warn_above_gb() > 0 && !warned_ &&
        static_cast<double>(m.rss_bytes) > options_.warn_above_gb() * 1e9) {
      warned_ = true;
      std::fprintf(stderr,
                   "memory_monitor: stage '%s' step %lld: resident memory %s passed %.1f GB\n",
                   e.stage.c_str(), static_cast<long long>(e.step), Megabytes(m.rss_bytes).c_str(),
                   options_.warn_above_gb());
    }
    int64_t every = options_.every_steps();
    if (every == 0) every = std::max<int64_t>(1, e.total_steps / 10);
    const bool report = e.type == EventType::kStageEnd || e.step % every == 0;
    if (!report) return Status::Ok();
    std::string line =
        "memory_monitor: stage '" + e.stage + "' " +
        (e.type == EventType::kStageEnd ? std::string("end") : "step " + std::to_string(e.step)) +
        ": rss " + Megabytes(m.rss_bytes) + " (" + SignedMegabytes(m.rss_bytes - last_.rss_bytes) +
        " since step " + std::to_string(last_step_) + "), peak " + Megabytes(m.peak_rss_bytes);
    if (m.cuda) {
      line += "; cuda allocated " + Megabytes(m.cuda_allocated_bytes) + " (" +
              SignedMegabytes(m.cuda_allocated_bytes - last_.cuda_allocated_bytes) +
              "), reserved " + Megabytes(m.cuda_reserved_bytes) + ", peak " +
              Megabytes(m.cuda_peak_allocated_bytes);
    }
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    last_ = m;
    last_step_ = e.step;
    return Status::Ok();
  }

 private:
  MemoryMonitorOptions options_;
  MemoryStats last_;
  int64_t last_step_ = 0;
  bool warned_ = false;
};

class MemoryMonitorPlugin : public CallbackPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return MemoryMonitorOptions::default_instance();
  }

  void ValidateOptions(const google::protobuf::Message& message,
                       OptionErrors* errors) const override {
    if (OptionsAs<MemoryMonitorOptions>(message).warn_above_gb() < 0) {
      errors->Add("warn_above_gb", "must be >= 0");
    }
  }

  StatusOr<std::unique_ptr<Callback>> Create(const google::protobuf::Message& message,
                                             const CallbackContext& /*context*/) const override {
    return std::unique_ptr<Callback>(new MemoryMonitor(OptionsAs<MemoryMonitorOptions>(message)));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("memory_monitor", ENGINE_KIND_CALLBACK, "0.1.0",
              "reports resident memory and CUDA allocator statistics with per-step deltas",
              engine::plugins::MemoryMonitorPlugin)
