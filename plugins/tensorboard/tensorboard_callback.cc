// The `tensorboard` callback: scalar summaries in TensorBoard's event files, one run per stage.
//
// Training metrics at step_end are tagged "train/<name>" (loss, lr, grad_norm, loss_scale, ...),
// evaluations keep their "eval/<name>" tags, memory goes to "memory/rss_mb". Files are named
// events.out.tfevents.<unix seconds>.<host>.<pid>, as TensorBoard expects, and flushed per event.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>

#include "engine/callback.h"
#include "record_writer.h"
#include "tensorboard_event.pb.h"
#include "tensorboard_options.pb.h"

namespace engine::plugins {
namespace {

double UnixTime() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// One event file.
class EventFile {
 public:
  Status Open(const std::filesystem::path& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    char host[256] = "localhost";
    ::gethostname(host, sizeof(host) - 1);
    path_ = dir / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(UnixTime())) + "." +
                   host + "." + std::to_string(::getpid()));
    out_.open(path_, std::ios::binary | std::ios::app);
    if (!out_) {
      return IoError("tensorboard cannot open '" + path_.string() + "': " + std::strerror(errno));
    }
    tensorboard::Event version;
    version.set_wall_time(UnixTime());
    version.set_file_version("brain.Event:2");
    return Write(version);
  }

  Status Scalars(int64_t step, const std::map<std::string, double>& scalars) {
    if (scalars.empty()) return Status::Ok();
    tensorboard::Event event;
    event.set_wall_time(UnixTime());
    event.set_step(step);
    for (const auto& [tag, value] : scalars) {
      auto* v = event.mutable_summary()->add_value();
      v->set_tag(tag);
      v->set_simple_value(static_cast<float>(value));
    }
    return Write(event);
  }

 private:
  Status Write(const tensorboard::Event& event) {
    out_ << tensorboard::FrameRecord(event.SerializeAsString());
    out_.flush();
    if (!out_) return IoError("tensorboard cannot write '" + path_.string() + "'");
    return Status::Ok();
  }

  std::filesystem::path path_;
  std::ofstream out_;
};

class Tensorboard : public Callback {
 public:
  Tensorboard(std::filesystem::path log_dir, bool per_stage_dirs, uint32_t every_steps)
      : log_dir_(std::move(log_dir)),
        per_stage_dirs_(per_stage_dirs),
        every_steps_(std::max<uint32_t>(1, every_steps)) {}

  Status OnEvent(const Event& e, CallbackActions& /*actions*/) override {
    if (e.stage.empty()) return Status::Ok();
    std::map<std::string, double> scalars;
    if (e.type == EventType::kStepEnd) {
      if (e.step % every_steps_ != 0 && e.step != e.total_steps) return Status::Ok();
      for (const auto& [name, value] : e.metrics) scalars["train/" + name] = value;
      scalars["memory/rss_mb"] = static_cast<double>(e.memory.rss_bytes) / 1e6;
    } else if (e.type == EventType::kEval) {
      scalars = e.metrics;
    } else {
      return Status::Ok();
    }
    auto it = files_.find(e.stage);
    if (it == files_.end()) {
      it = files_.emplace(e.stage, std::make_unique<EventFile>()).first;
      ENGINE_RETURN_IF_ERROR(it->second->Open(per_stage_dirs_ ? log_dir_ / e.stage : log_dir_));
    }
    return it->second->Scalars(e.step, scalars);
  }

 private:
  std::filesystem::path log_dir_;
  bool per_stage_dirs_;
  uint32_t every_steps_;
  std::map<std::string, std::unique_ptr<EventFile>> files_;
};

class TensorboardPlugin : public CallbackPlugin {
 public:
  const google::protobuf::Message& default_options() const override {
    return TensorboardOptions::default_instance();
  }

  StatusOr<std::unique_ptr<Callback>> Create(const google::protobuf::Message& message,
                                             const CallbackContext& context) const override {
    const auto& options = OptionsAs<TensorboardOptions>(message);
    // A pipeline callback sees every stage: one run directory each. A stage callback's directory
    // is its stage's already.
    const bool per_stage_dirs = context.stage.empty();
    return std::unique_ptr<Callback>(
        new Tensorboard(context.OutputPath(options.log_dir(), "tensorboard"), per_stage_dirs,
                        options.every_steps()));
  }
};

}  // namespace
}  // namespace engine::plugins

ENGINE_PLUGIN("tensorboard", ENGINE_KIND_CALLBACK, "0.1.0",
              "writes scalar summaries to TensorBoard event files, one run per stage",
              engine::plugins::TensorboardPlugin)
