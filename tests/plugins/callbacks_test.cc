// The built-in callbacks, driven with events as the engine sends them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/callback.h"
#include "plugin_test_util.h"
#include "testing/temp_dir.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

class RecordingActions : public CallbackActions {
 public:
  void RequestStop(const std::string& reason) override { stops.push_back(reason); }
  void RequestCheckpoint() override { ++checkpoints; }
  std::vector<std::string> stops;
  int checkpoints = 0;
};

std::unique_ptr<Callback> Make(const std::string& name, const std::string& options,
                               const CallbackContext& context = {}) {
  const auto& plugin = testing::BuiltinPlugin<CallbackPlugin>(PluginKind::kCallback, name);
  auto made = plugin.Create(*testing::Options(plugin, options), context);
  EXPECT_TRUE(made.ok()) << made.status().message();
  return made.ok() ? std::move(*made) : nullptr;
}

Event At(EventType type, int64_t step, std::map<std::string, double> metrics = {}) {
  Event e;
  e.type = type;
  e.pipeline = "p";
  e.stage = "s";
  e.step = step;
  e.total_steps = 100;
  e.metrics = std::move(metrics);
  return e;
}

std::vector<std::string> Lines(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(MetricsJsonlTest, OneJsonLinePerEvent) {
  testing::TempDir dir;
  CallbackContext context{"p", dir.path(), dir.path() / "out/s", "s"};
  auto cb = Make("metrics_jsonl", "every_steps: 2", context);
  RecordingActions actions;
  ASSERT_TRUE(cb->OnEvent(At(EventType::kStageBegin, 0), actions).ok());
  for (int step = 1; step <= 4; ++step) {
    Event e = At(EventType::kStepEnd, step, {{"loss", 1.0 / step}});
    e.memory.rss_bytes = 1000;
    ASSERT_TRUE(cb->OnEvent(e, actions).ok());
  }
  ASSERT_TRUE(cb->OnEvent(At(EventType::kEval, 4, {{"eval/accuracy", 0.5}}), actions).ok());
  auto lines = Lines(dir.path() / "out/s/metrics.jsonl");
  ASSERT_EQ(lines.size(), 4u);  // stage_begin, steps 2 and 4, eval
  auto step2 = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(step2["event"], "step_end");
  EXPECT_EQ(step2["stage"], "s");
  EXPECT_EQ(step2["step"], 2);
  EXPECT_DOUBLE_EQ(step2["metrics"]["loss"], 0.5);
  EXPECT_EQ(step2["rss_bytes"], 1000);
  EXPECT_GT(step2["time"].get<double>(), 1.7e9);
  EXPECT_EQ(nlohmann::json::parse(lines[3])["metrics"]["eval/accuracy"], 0.5);
}

TEST(MetricsJsonlTest, UnwritablePathIsAnError) {
  auto cb = Make("metrics_jsonl", "path: \"/proc/version/m.jsonl\"");
  RecordingActions actions;
  Status s = cb->OnEvent(At(EventType::kStageBegin, 0), actions);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("metrics_jsonl cannot open '/proc/version/m.jsonl'"));
}

// A CRC-32C computed bit by bit, independent of the plugin's table.
uint32_t Crc32cBitwise(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFF;
  for (unsigned char c : bytes) {
    crc ^= c;
    for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ (0x82F63B78 & (0u - (crc & 1)));
  }
  return ~crc;
}

uint32_t Masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t LittleEndian(const std::string& bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return v;
}

// Just enough of the protobuf wire format to read TensorBoard events: field number -> values.
struct Fields {
  std::multimap<int, uint64_t> varints;
  std::multimap<int, std::string> bytes;
  std::multimap<int, uint64_t> fixed64;
  std::multimap<int, uint32_t> fixed32;
};

Fields Decode(const std::string& data) {
  Fields f;
  size_t i = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const unsigned char b = data[i++];
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (i < data.size()) {
    const uint64_t key = varint();
    const int field = static_cast<int>(key >> 3);
    switch (key & 7) {
      case 0:
        f.varints.emplace(field, varint());
        break;
      case 1:
        f.fixed64.emplace(field, LittleEndian(data, i, 8));
        i += 8;
        break;
      case 2: {
        const uint64_t n = varint();
        f.bytes.emplace(field, data.substr(i, n));
        i += n;
        break;
      }
      case 5:
        f.fixed32.emplace(field, static_cast<uint32_t>(LittleEndian(data, i, 4)));
        i += 4;
        break;
    }
  }
  return f;
}

TEST(TensorboardTest, EventFilesHaveValidRecordsAndScalars) {
  testing::TempDir dir;
  CallbackContext context{"p", dir.path(), dir.path() / "out/s", "s"};
  auto cb = Make("tensorboard", "", context);
  RecordingActions actions;
  ASSERT_TRUE(cb->OnEvent(At(EventType::kStageBegin, 0), actions).ok());
  ASSERT_TRUE(cb->OnEvent(At(EventType::kStepEnd, 1, {{"loss", 2.5}}), actions).ok());
  ASSERT_TRUE(cb->OnEvent(At(EventType::kEval, 1, {{"eval/accuracy", 0.75}}), actions).ok());

  std::vector<std::filesystem::path> files;
  for (const auto& item : std::filesystem::directory_iterator(dir.path() / "out/s/tensorboard")) {
    files.push_back(item.path());
  }
  ASSERT_EQ(files.size(), 1u);
  EXPECT_THAT(files[0].filename().string(), HasSubstr("events.out.tfevents."));
  const std::string bytes = testing::ReadText(files[0]);
  std::vector<std::string> records;
  for (size_t at = 0; at < bytes.size();) {
    ASSERT_LE(at + 12, bytes.size());
    const uint64_t length = LittleEndian(bytes, at, 8);
    EXPECT_EQ(LittleEndian(bytes, at + 8, 4), Masked(Crc32cBitwise(bytes.substr(at, 8))));
    const std::string data = bytes.substr(at + 12, length);
    EXPECT_EQ(LittleEndian(bytes, at + 12 + length, 4), Masked(Crc32cBitwise(data)));
    records.push_back(data);
    at += 12 + length + 4;
  }
  ASSERT_EQ(records.size(), 3u);
  Fields version = Decode(records[0]);
  EXPECT_EQ(version.bytes.find(3)->second, "brain.Event:2");  // file_version
  Fields step = Decode(records[1]);
  EXPECT_EQ(step.varints.find(2)->second, 1u);  // step
  std::map<std::string, float> scalars;
  for (const auto& [field, summary] : Decode(step.bytes.find(5)->second).bytes) {
    Fields value = Decode(summary);
    const uint32_t raw = value.fixed32.find(2)->second;
    float f;
    std::memcpy(&f, &raw, 4);
    scalars[value.bytes.find(1)->second] = f;
  }
  EXPECT_EQ(scalars.at("train/loss"), 2.5f);
  EXPECT_TRUE(scalars.count("memory/rss_mb"));
  Fields eval = Decode(Decode(Decode(records[2]).bytes.find(5)->second).bytes.find(1)->second);
  EXPECT_EQ(eval.bytes.find(1)->second, "eval/accuracy");
  EXPECT_EQ(Crc32cBitwise("123456789"), 0xE3069283u) << "the reference check value of CRC-32C";
}

TEST(TensorboardTest, PipelineCallbacksWriteOneRunPerStage) {
  testing::TempDir dir;
  auto cb = Make("tensorboard", "", CallbackContext{"p", dir.path(), dir.path() / "out", ""});
  RecordingActions actions;
  Event a = At(EventType::kStepEnd, 1, {{"loss", 1}});
  Event b = a;
  b.stage = "t";
  ASSERT_TRUE(cb->OnEvent(a, actions).ok());
  ASSERT_TRUE(cb->OnEvent(b, actions).ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir.path() / "out/tensorboard/s"));
  EXPECT_TRUE(std::filesystem::is_directory(dir.path() / "out/tensorboard/t"));
}

TEST(EarlyStoppingTest, StopsAfterPatienceEvaluationsWithoutImprovement) {
  auto cb = Make("early_stopping", "metric: \"eval/accuracy\" patience: 2 min_delta: 0.01");
  RecordingActions actions;
  ASSERT_TRUE(cb->OnEvent(At(EventType::kStageBegin, 0), actions).ok());
  const std::vector<double> accuracy = {0.80, 0.90, 0.905, 0.85};
  for (size_t i = 0; i < accuracy.size(); ++i) {
    ASSERT_TRUE(
        cb->OnEvent(At(EventType::kEval, 10 * (i + 1), {{"eval/accuracy", accuracy[i]}}), actions)
            .ok());
  }
  ASSERT_EQ(actions.stops.size(), 1u);
  EXPECT_EQ(actions.stops[0],
            "eval/accuracy did not improve for 2 evaluation(s) (best 0.9 at step 20)");
}

TEST(EarlyStoppingTest, LossIsMinimisedAndAMissingMetricIsNamed) {
  auto cb = Make("early_stopping", "patience: 1");
  RecordingActions actions;
  ASSERT_TRUE(cb->OnEvent(At(EventType::kEval, 10, {{"eval/loss", 1.0}}), actions).ok());
  ASSERT_TRUE(cb->OnEvent(At(EventType::kEval, 20, {{"eval/loss", 0.5}}), actions).ok());
  EXPECT_TRUE(actions.stops.empty());
  ASSERT_TRUE(cb->OnEvent(At(EventType::kEval, 30, {{"eval/loss", 0.6}}), actions).ok());
  EXPECT_EQ(actions.stops.size(), 1u);
  Status missing = cb->OnEvent(At(EventType::kEval, 40, {{"eval/accuracy", 1}}), actions);
  EXPECT_THAT(missing.message(), HasSubstr("(it reports: eval/accuracy)"));
}

TEST(CheckpointEveryTest, AsksEveryNSteps) {
  auto cb = Make("checkpoint_every", "steps: 25 minutes: 0");
  RecordingActions actions;
  ASSERT_TRUE(cb->OnEvent(At(EventType::kStageBegin, 0), actions).ok());
  for (int step = 1; step <= 100; ++step) {
    ASSERT_TRUE(cb->OnEvent(At(EventType::kStepEnd, step), actions).ok());
  }
  EXPECT_EQ(actions.checkpoints, 3) << "25, 50, 75; the final checkpoint is always written";
  OptionErrors errors;
  const auto& plugin =
      testing::BuiltinPlugin<CallbackPlugin>(PluginKind::kCallback, "checkpoint_every");
  plugin.ValidateOptions(*testing::Options(plugin, "minutes: 0"), &errors);
  ASSERT_EQ(errors.entries().size(), 1u);
  EXPECT_THAT(errors.entries()[0].message, HasSubstr("set steps or minutes"));
}

TEST(MemoryMonitorTest, ReportsResidentMemoryWithDeltas) {
  auto cb = Make("memory_monitor", "every_steps: 5 warn_above_gb: 0.000001");
  RecordingActions actions;
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(cb->OnEvent(At(EventType::kStageBegin, 0), actions).ok());
  for (int step = 1; step <= 10; ++step) {
    Event e = At(EventType::kStepEnd, step);
    e.memory = ReadMemoryStats();
    ASSERT_TRUE(cb->OnEvent(e, actions).ok());
  }
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(out, HasSubstr("memory_monitor: stage 's' step 5: rss "));
  EXPECT_THAT(out, HasSubstr(" since step 0), peak "));
  EXPECT_THAT(out, HasSubstr("memory_monitor: stage 's' step 10: rss "));
  EXPECT_THAT(out, HasSubstr("since step 5"));
  EXPECT_THAT(out, HasSubstr("passed 0.0 GB"));
  EXPECT_GT(ReadMemoryStats().rss_bytes, 1'000'000);
  EXPECT_GE(ReadMemoryStats().peak_rss_bytes, ReadMemoryStats().rss_bytes);
}

}  // namespace
}  // namespace engine
