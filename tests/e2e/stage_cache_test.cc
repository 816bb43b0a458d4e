// Stage caching: `engine run` skips a stage whose finished checkpoint is up to date,
// trains again what changed and everything that starts from it, and obeys --force and --from.
// Missing, corrupt and truncated parent checkpoints and a full disk during a save give clear errors
// and leave earlier checkpoints intact.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "checkpoint/checkpoint.h"
#include "core/remove_tree.h"
#include "engine/checkpoint.pb.h"
#include "testing/pipelines.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string RunId(const std::filesystem::path& final_dir) {
  auto manifest = ReadManifest(final_dir);
  EXPECT_TRUE(manifest.ok()) << manifest.status().message();
  return manifest.ok() ? manifest->run_id() : "";
}

class StageCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = tmp_.Write("p.pbtxt", testing::TwoStageDigitsPipeline());
    auto r = Run({});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    a_run_ = RunId(Out() / "a/final");
    b_run_ = RunId(Out() / "b/final");
    ASSERT_FALSE(a_run_.empty());
    ASSERT_NE(a_run_, b_run_);
  }

  testing::CommandResult Run(std::vector<std::string> flags) {
    flags.insert(flags.begin(), {"run", file_.string()});
    return testing::RunEngine(flags);
  }
  std::filesystem::path Out() const { return tmp_.path() / "out"; }

  testing::TempDir tmp_;
  std::filesystem::path file_;
  std::string a_run_, b_run_;
};

TEST_F(StageCacheTest, ASecondRunSkipsUpToDateStagesAndWritesNothing) {
  const auto before = std::filesystem::last_write_time(Out() / "b/final/model.safetensors");
  auto r = Run({});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': up to date (--force=a trains it again); 23 steps, "
                               "finished "));
  EXPECT_THAT(r.out, HasSubstr("stage 'b': up to date (--force=b trains it again); 46 steps"));
  EXPECT_THAT(r.out, HasSubstr("eval: accuracy 0."));
  EXPECT_THAT(r.out, Not(HasSubstr(" steps in ")));
  EXPECT_EQ(RunId(Out() / "a/final"), a_run_);
  EXPECT_EQ(RunId(Out() / "b/final"), b_run_);
  EXPECT_EQ(std::filesystem::last_write_time(Out() / "b/final/model.safetensors"), before);
}

TEST_F(StageCacheTest, CheckpointSettingsDoNotMakeAStageOutOfDate) {
  file_ = tmp_.Write("p.pbtxt", testing::TwoStageDigitsPipeline(
                                    "", "  checkpoint { keep_last: 5 }",
                                    "  checkpoint { keep_last: 1 save_optimizer_state: false }"));
  auto r = Run({});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': up to date"));
  EXPECT_THAT(r.out, HasSubstr("stage 'b': up to date"));
}

TEST_F(StageCacheTest, AChangedChildTrainsAloneAndAChangedParentTrainsBoth) {
  file_ = tmp_.Write("p.pbtxt",
                     testing::TwoStageDigitsPipeline("", "", "  parallel { num_threads: 1 }"));
  auto r = Run({});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': up to date"));
  EXPECT_THAT(r.out, HasSubstr("stage 'b': training again: its configuration, data, plugins or a "
                               "stage it comes after changed (fingerprint "));
  EXPECT_EQ(RunId(Out() / "a/final"), a_run_);
  const std::string b_second = RunId(Out() / "b/final");
  EXPECT_NE(b_second, b_run_);

  // a changes; b's own configuration does not, but its parent's weights do.
  file_ = tmp_.Write("p.pbtxt", testing::TwoStageDigitsPipeline("", "  parallel { num_threads: 1 }",
                                                                "  parallel { num_threads: 1 }"));
  r = Run({});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': training again: its configuration"));
  EXPECT_THAT(r.out, HasSubstr("stage 'b': training again: the stage it starts from was trained "
                               "again since"));
  auto b = ReadManifest(Out() / "b/final");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->parent_run_id(), RunId(Out() / "a/final"));
  EXPECT_NE(b->run_id(), b_second);
}

TEST_F(StageCacheTest, ForceTrainsAStageAndWhatStartsFromIt) {
  auto r = Run({"--force=a"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': 23 steps in "));
  EXPECT_THAT(r.out, HasSubstr("stage 'b': training again: the stage it starts from"));
  EXPECT_NE(RunId(Out() / "a/final"), a_run_);
  EXPECT_NE(RunId(Out() / "b/final"), b_run_);

  const std::string a_now = RunId(Out() / "a/final");
  r = Run({"--force=b"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': up to date"));
  EXPECT_THAT(r.out, HasSubstr("stage 'b': 46 steps in "));
  EXPECT_EQ(RunId(Out() / "a/final"), a_now);
}

TEST_F(StageCacheTest, FromTrainsTheStageAndLaterOnesAndUsesEarlierOnesAsTheyAre) {
  // a's configuration changed, but --from=b says: take a as it is.
  file_ = tmp_.Write("p.pbtxt",
                     testing::TwoStageDigitsPipeline("", "  parallel { num_threads: 1 }", ""));
  auto r = Run({"--from=b"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': used as it is (--from=b), although its configuration, "
                               "data, plugins or a stage it comes after changed"));
  EXPECT_THAT(r.out, HasSubstr("stage 'b': 46 steps in "));
  EXPECT_EQ(RunId(Out() / "a/final"), a_run_);
  EXPECT_NE(RunId(Out() / "b/final"), b_run_);
}

TEST_F(StageCacheTest, UnknownStagesInForceOrFromAreUsageErrors) {
  auto r = Run({"--force=a,nope"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--force names stage 'nope', which the pipeline does not have; "
                               "its stages are 'a', 'b'"));
  r = Run({"--from=nope"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--from names stage 'nope'"));
  r = Run({"--force="});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--force needs stage names"));
  // The names are checked before planning (which loads data and models): a pipeline whose data
  // is missing still gets the usage error first.
  std::string text = testing::TwoStageDigitsPipeline();
  const std::string data = testing::DigitsDataPath().string();
  for (size_t at; (at = text.find(data)) != std::string::npos;)
    text.replace(at, data.size(), "/nonexistent.csv.gz");
  r = testing::RunEngine({"run", tmp_.Write("missing.pbtxt", text).string(), "--from=nope"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--from names stage 'nope'"));
  EXPECT_THAT(r.err, Not(HasSubstr("cannot open")));
}

TEST_F(StageCacheTest, FromWithAMissingParentCheckpointFailsBeforeTraining) {
  std::error_code ec;
  RemoveTree(Out() / "a", ec);  // not std::filesystem::remove_all (core/remove_tree.h says why)
  auto r = Run({"--from=b"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("stage 'a' comes before --from=b but cannot be used as it is: no "
                               "finished checkpoint in "));
  EXPECT_EQ(RunId(Out() / "b/final"), b_run_) << "b untouched";
}

// A parent that fails stops the pipeline there: its child never starts, and neither leaves a
// final checkpoint behind.
TEST(StageCacheFailureTest, AFailedParentStopsThePipelineBeforeItsChild) {
  testing::TempDir tmp;
  const auto file = tmp.Write(
      "p.pbtxt",
      testing::TwoStageDigitsPipeline(
          "plugin_path: \"" + std::string(testing::kTestPluginDir) + "/throwing_callback\"",
          "  callback { plugin: \"throwing_callback\" options { "
          "[type.googleapis.com/engine.fixtures.ThrowingCallbackOptions] { fail_at_step: 2 } } "
          "on_error: FAIL_STAGE }\n"));
  auto r = testing::RunEngine({"run", file.string()}, tmp.path().string());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("stage 'a': callback 'throwing_callback' on step_end at step 2"));
  EXPECT_THAT(r.out, Not(HasSubstr("stage 'b' starts")));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "out/a/final"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "out/b"));
}

TEST_F(StageCacheTest, ATruncatedParentIsAClearErrorWithFromAndIsTrainedAgainWithout) {
  const auto weights = Out() / "a/final/model.safetensors";
  std::filesystem::resize_file(weights, std::filesystem::file_size(weights) / 2);
  auto r = Run({"--from=b"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("stage 'a' comes before --from=b but cannot be used as it is: its "
                               "checkpoint is damaged ("));
  EXPECT_THAT(r.err, HasSubstr(weights.string()));
  EXPECT_EQ(RunId(Out() / "b/final"), b_run_) << "b's earlier checkpoint is intact";

  r = Run({});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': training again: its checkpoint is damaged ("));
  EXPECT_THAT(r.out, HasSubstr("stage 'b': training again: the stage it starts from"));
}

TEST_F(StageCacheTest, BytesChangedInPlaceAreFoundByTheContentHash) {
  const auto weights = Out() / "a/final/model.safetensors";
  const auto size = std::filesystem::file_size(weights);
  auto verify = testing::RunEngine({"verify", Out().string()});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("ok      " + (Out() / "a/final").string() + " (step 23, "));
  {
    std::fstream stream(weights, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekp(static_cast<std::streamoff>(size - 16));
    stream.write("\xff\xff\xff\x7f\xff\xff\xff\x7f", 8);  // NaNs, same length
  }
  ASSERT_EQ(std::filesystem::file_size(weights), size);
  verify = testing::RunEngine({"verify", Out().string()});
  EXPECT_EQ(verify.exit_code, 1);
  EXPECT_THAT(verify.out, HasSubstr("DAMAGED " + (Out() / "a/final").string() + ": " +
                                    weights.string() + " changed since it was written"));
  EXPECT_THAT(verify.out, HasSubstr(" checkpoints, 1 damaged\n"));
  auto r = Run({"--from=b"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(weights.string() + " changed since it was written"));
  EXPECT_EQ(RunId(Out() / "b/final"), b_run_) << "b's earlier checkpoint is intact";
  r = Run({});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': training again: its checkpoint is damaged (" +
                               weights.string() + " changed since it was written"));
  EXPECT_NE(RunId(Out() / "a/final"), a_run_);
}

// The manifest is hashed too: an edit that still parses (another step) is found as damage, by
// `engine verify`, by --from and by a run, which trains the stage again.
TEST_F(StageCacheTest, AnEditedManifestIsFoundByItsRecordedHash) {
  const auto manifest = Out() / "a/final/manifest.pbtxt";
  std::string text = testing::ReadText(manifest);
  const std::string step = "step: 23\n";
  ASSERT_NE(text.find(step), std::string::npos) << text;
  text.replace(text.find(step), step.size(), "step: 24\n");
  std::ofstream(manifest, std::ios::trunc) << text;
  const std::string damage =
      "checkpoint manifest '" + manifest.string() + "' changed after it was written";
  auto verify = testing::RunEngine({"verify", Out().string()});
  EXPECT_EQ(verify.exit_code, 1);
  EXPECT_THAT(verify.out, HasSubstr("DAMAGED " + (Out() / "a/final").string()));
  EXPECT_THAT(verify.out, HasSubstr(damage));
  auto r = Run({"--from=b"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(damage));
  r = Run({});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': training again: its checkpoint is"));
  EXPECT_NE(RunId(Out() / "a/final"), a_run_);
}

TEST_F(StageCacheTest, ACorruptParentManifestIsAClearError) {
  const auto manifest = Out() / "a/final/manifest.pbtxt";
  std::ofstream(manifest, std::ios::trunc) << "format_version: 1\nstep: \"many\"\n";
  auto r = Run({"--from=b"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("checkpoint manifest '" + manifest.string() + "' is corrupt"));
  r = Run({});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'a': training again: its checkpoint is unreadable ("));
}

TEST_F(StageCacheTest, AFullDiskDuringASaveFailsClearlyAndKeepsEarlierCheckpoints) {
  const std::string before = testing::ReadText(Out() / "b/final/manifest.pbtxt");
  const auto weights_size = std::filesystem::file_size(Out() / "b/final/model.safetensors");
  // An 8 KiB file size limit: b's first periodic checkpoint (weights near 10 KiB) cannot be
  // written. SIGXFSZ is ignored (inherited through exec), so the write fails with EFBIG as a write
  // to a full disk fails with ENOSPC.
  auto r = testing::RunCommand(
      {"/bin/bash", "-c", "trap '' XFSZ; ulimit -f 8; exec \"$0\" run \"$1\" --force=b",
       testing::kEngineBinary, file_.string()},
      "", {{"ENGINE_PLUGIN_PATH", ""}});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("stage 'b': checkpoint '" +
                               (Out() / "b/checkpoints/step-00000005").string() +
                               "' was not written (earlier checkpoints are intact): cannot write"));
  EXPECT_THAT(r.err, HasSubstr("File too large"));
  EXPECT_EQ(testing::ReadText(Out() / "b/final/manifest.pbtxt"), before);
  EXPECT_EQ(std::filesystem::file_size(Out() / "b/final/model.safetensors"), weights_size);
  for (const auto& item : std::filesystem::recursive_directory_iterator(Out())) {
    EXPECT_THAT(item.path().filename().string(), Not(HasSubstr(".tmp"))) << item.path();
  }
  // With room again, a plain run finds b's earlier final checkpoint still up to date.
  r = Run({});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'b': up to date")) << "the failed --force left b's final";
}

}  // namespace
}  // namespace engine
