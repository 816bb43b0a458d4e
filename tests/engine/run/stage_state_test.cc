// What `engine run` makes of a stage's directory: an up-to-date finished checkpoint, one that is
// out of date (and why), and the periodic checkpoint to resume from.
#include "run/stage_state.h"

#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <fstream>

#include "checkpoint/checkpoint.h"
#include "testing/temp_dir.h"

namespace engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

void Write(const std::filesystem::path& dir, const std::string& fingerprint, uint64_t step,
           bool final, const std::string& parent_run_id = "", bool optimizer = true,
           const std::string& any_world_fingerprint = "") {
  CheckpointContents contents;
  if (!any_world_fingerprint.empty()) {
    contents.manifest.set_any_world_fingerprint(any_world_fingerprint);
  }
  contents.manifest.set_stage("s");
  contents.manifest.set_step(step);
  contents.manifest.set_final(final);
  contents.manifest.set_fingerprint(fingerprint);
  contents.manifest.set_run_id("run-1");
  contents.manifest.set_parent_run_id(parent_run_id);
  contents.model = {{"w", at::ones({4, 3})}, {"b", at::zeros({4})}};
  if (optimizer) contents.optimizer = {{"w.exp_avg", at::zeros({4, 3})}};
  ASSERT_TRUE(WriteCheckpoint(dir, std::move(contents)).ok());
}

TEST(StageStateTest, AFinishedCheckpointWithTheSameFingerprintIsUpToDate) {
  testing::TempDir tmp;
  Write(tmp.path() / "final", "f1", 10, true, "p1");
  FinalCheckpointState state = InspectFinalCheckpoint(tmp.path() / "final", "f1", "p1");
  EXPECT_TRUE(state.up_to_date) << state.reason;
  ASSERT_TRUE(state.manifest.has_value());
  EXPECT_EQ(state.manifest->step(), 10u);
}

TEST(StageStateTest, SaysWhyAFinishedCheckpointIsOutOfDate) {
  testing::TempDir tmp;
  const auto dir = tmp.path() / "final";
  EXPECT_EQ(InspectFinalCheckpoint(dir, "f1", "").reason, "no finished checkpoint");
  Write(dir, "f1", 10, true, "p1");
  EXPECT_THAT(InspectFinalCheckpoint(dir, "f2", "p1").reason,
              HasSubstr("its configuration, data, plugins or a stage it comes after changed "
                        "(fingerprint f1, now f2)"));
  EXPECT_EQ(InspectFinalCheckpoint(dir, "f1", "p2").reason,
            "the stage it starts from was trained again since");

  std::filesystem::resize_file(dir / kModelFile, std::filesystem::file_size(dir / kModelFile) - 8);
  FinalCheckpointState damaged = InspectFinalCheckpoint(dir, "f1", "p1");
  EXPECT_FALSE(damaged.up_to_date);
  EXPECT_THAT(damaged.reason, HasSubstr("its checkpoint is damaged ("));
  EXPECT_THAT(damaged.reason, HasSubstr(kModelFile));

  std::ofstream(dir / kManifestFile, std::ios::trunc) << "not a manifest {";
  FinalCheckpointState unreadable = InspectFinalCheckpoint(dir, "f1", "p1");
  EXPECT_THAT(unreadable.reason, HasSubstr("its checkpoint is unreadable ("));
  EXPECT_FALSE(unreadable.manifest.has_value());
}

TEST(StageStateTest, AModelFileThatDisagreesWithItsManifestIsDamaged) {
  testing::TempDir tmp;
  Write(tmp.path() / "final", "f1", 10, true);
  Write(tmp.path() / "other", "f1", 10, true);
  CheckpointContents other;
  other.model = {{"w", at::ones({4, 4})}, {"b", at::zeros({4})}};
  ASSERT_TRUE(WriteCheckpoint(tmp.path() / "other", std::move(other)).ok());
  std::filesystem::copy_file(tmp.path() / "other" / kModelFile, tmp.path() / "final" / kModelFile,
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_THAT(InspectFinalCheckpoint(tmp.path() / "final", "f1", "").reason,
              HasSubstr(kModelFile + std::string(" is ")));
  // A manifest without file digests (an older engine's) is checked by its tensors.
  auto manifest = ReadManifest(tmp.path() / "final");
  ASSERT_TRUE(manifest.ok());
  manifest->clear_file();
  std::string text;
  google::protobuf::TextFormat::PrintToString(*manifest, &text);
  std::ofstream(tmp.path() / "final" / kManifestFile, std::ios::trunc) << text;
  std::filesystem::remove(tmp.path() / "final" / kManifestHashFile);  // nor a manifest hash
  EXPECT_THAT(InspectFinalCheckpoint(tmp.path() / "final", "f1", "").reason,
              HasSubstr("tensor 'w' is missing or differs from its manifest"));
}

// Overwrites `count` bytes in the middle of `file` without changing its size.
void FlipBytesInPlace(const std::filesystem::path& file, size_t count) {
  std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto size = std::filesystem::file_size(file);
  stream.seekg(static_cast<std::streamoff>(size - 24));
  std::string bytes(count, '\0');
  stream.read(bytes.data(), static_cast<std::streamsize>(count));
  for (char& c : bytes) c = static_cast<char>(~c);
  stream.seekp(static_cast<std::streamoff>(size - 24));
  stream.write(bytes.data(), static_cast<std::streamsize>(count));
}

TEST(StageStateTest, BytesChangedInPlaceMakeAFinishedCheckpointDamaged) {
  testing::TempDir tmp;
  const auto dir = tmp.path() / "final";
  Write(dir, "f1", 10, true, "p1");
  const auto size = std::filesystem::file_size(dir / kModelFile);
  FlipBytesInPlace(dir / kModelFile, 4);
  ASSERT_EQ(std::filesystem::file_size(dir / kModelFile), size);
  FinalCheckpointState state = InspectFinalCheckpoint(dir, "f1", "p1");
  EXPECT_FALSE(state.up_to_date);
  EXPECT_TRUE(state.damaged);
  EXPECT_THAT(state.reason, HasSubstr("its checkpoint is damaged (" + (dir / kModelFile).string() +
                                      " changed since it was written (content hash "));
}

TEST(StageStateTest, ManifestRecordsSizeAndHashOfEveryFile) {
  testing::TempDir tmp;
  Write(tmp.path() / "final", "f1", 10, true);
  auto manifest = ReadManifest(tmp.path() / "final");
  ASSERT_TRUE(manifest.ok());
  ASSERT_EQ(manifest->file_size(), 2);
  EXPECT_EQ(manifest->file(0).name(), kModelFile);
  EXPECT_EQ(manifest->file(0).size(),
            std::filesystem::file_size(tmp.path() / "final" / kModelFile));
  EXPECT_EQ(manifest->file(0).xxh3().size(), 16u);
  EXPECT_EQ(manifest->file(1).name(), kOptimizerFile);
}

TEST(StageStateTest, WithFromADamagedEarlierStageIsRefusedNamingTheFile) {
  testing::TempDir tmp;
  Write(FinalCheckpointDir(tmp.path()), "old", 10, true);
  FlipBytesInPlace(FinalCheckpointDir(tmp.path()) / kOptimizerFile, 2);
  StageSituation situation;
  situation.stage = "s";
  situation.stage_dir = tmp.path();
  situation.fingerprint = "new";  // out of date, which --from would accept
  situation.before_from = true;
  situation.from = "t";
  StageDecision decision = DecideStage(situation);
  ASSERT_EQ(decision.action, StageDecision::Action::kRefuse);
  EXPECT_THAT(decision.refusal.message(), HasSubstr(kOptimizerFile));
  EXPECT_THAT(decision.refusal.message(), HasSubstr("changed since it was written"));
  EXPECT_THAT(decision.refusal.message(), HasSubstr("Run without --from to train it"));
}

TEST(StageStateTest, ResumesFromTheNewestUsablePeriodicCheckpoint) {
  testing::TempDir tmp;
  const auto checkpoints = tmp.path() / "checkpoints";
  Write(checkpoints / "step-00000010", "f1", 10, false, "p1");
  Write(checkpoints / "step-00000020", "f1", 20, false, "p1");
  Write(checkpoints / "step-00000030", "f1", 30, false, "p1");
  Write(checkpoints / "step-00000040", "f0", 40, false, "p1");  // another configuration
  Write(checkpoints / "step-00000050", "f1", 50, false, "p0");  // from another parent training
  Write(checkpoints / "step-00000060", "f1", 60, false, "p1", /*optimizer=*/false);
  Write(checkpoints / "step-00000035", "f1", 35, false, "p1");
  FlipBytesInPlace(checkpoints / "step-00000035" / kModelFile, 4);
  // A write that never finished: hidden, never a candidate even though complete inside.
  Write(checkpoints / ".step-00000070.tmp-1-0", "f1", 70, false, "p1");
  const auto newest = checkpoints / "step-00000030" / kOptimizerFile;
  std::filesystem::resize_file(newest, std::filesystem::file_size(newest) - 4);

  std::vector<std::string> notes;
  std::optional<ResumePoint> point = FindResumePoint(tmp.path(), "f1", "p1", &notes);
  ASSERT_TRUE(point.has_value());
  EXPECT_EQ(point->dir, checkpoints / "step-00000020");
  EXPECT_EQ(point->manifest.step(), 20u);
  ASSERT_EQ(notes.size(), 3u);
  EXPECT_THAT(notes[0], HasSubstr("step-00000060 has no optimizer state"));
  EXPECT_THAT(notes[1], HasSubstr("step-00000035 is damaged ("));
  EXPECT_THAT(notes[1], HasSubstr("changed since it was written"));
  EXPECT_THAT(notes[2], HasSubstr("step-00000030 is damaged ("));
}

TEST(StageStateTest, ACheckpointOfThisScheduleIsPreferredAndAnotherScheduleIsRefusedWithTheWayOut) {
  // "a" is the stage on another schedule (another world size), "b" on this one: an older
  // checkpoint of this schedule is resumed from; with none, the newest of the other is refused.
  testing::TempDir tmp;
  const auto checkpoints = tmp.path() / "checkpoints";
  Write(checkpoints / "step-00000030", "a", 30, false, "", true, "any");
  Write(checkpoints / "step-00000040", "a", 40, false, "", true, "any");
  Write(checkpoints / "step-00000050", "other", 50, false, "", true, "another stage");
  StageSituation situation;
  situation.stage = "s";
  situation.stage_dir = tmp.path();
  situation.fingerprint = "b";
  situation.any_world_fingerprint = "any";
  situation.another_schedule = [](const ResumePoint& point) {
    return "refused for " + point.dir.filename().string();
  };
  StageDecision decision = DecideStage(situation);
  EXPECT_EQ(decision.action, StageDecision::Action::kRefuse);
  EXPECT_EQ(decision.refusal.message(), "refused for step-00000040");
  EXPECT_FALSE(decision.resume.has_value());

  Write(checkpoints / "step-00000020", "b", 20, false, "", true, "any");
  decision = DecideStage(situation);
  EXPECT_EQ(decision.action, StageDecision::Action::kTrain);
  ASSERT_TRUE(decision.resume.has_value());
  EXPECT_EQ(decision.resume->manifest.step(), 20u);

  // A plain stage has no any_world_fingerprint: other schedules are other configurations.
  situation.fingerprint = "c";
  situation.any_world_fingerprint.clear();
  decision = DecideStage(situation);
  EXPECT_EQ(decision.action, StageDecision::Action::kTrain);
  EXPECT_FALSE(decision.resume.has_value());
}

TEST(StageStateTest, NoCheckpointsMeansNoResume) {
  testing::TempDir tmp;
  std::vector<std::string> notes;
  EXPECT_FALSE(FindResumePoint(tmp.path(), "f1", "", &notes).has_value());
  EXPECT_THAT(notes, IsEmpty());
  Write(tmp.path() / "checkpoints" / "step-00000010", "f0", 10, false);
  EXPECT_FALSE(FindResumePoint(tmp.path(), "f1", "", &notes).has_value());
  EXPECT_THAT(notes, IsEmpty()) << "other configurations' checkpoints are not worth a note";
}

}  // namespace
}  // namespace engine
