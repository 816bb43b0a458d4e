// DDP over Gloo on loopback: two ranks with half the batch each end where one rank with
// the whole batch ends; the plan shows the ranks; ranks started by hand (as torchrun does) write
// the checkpoint once, from rank 0; a stage that does not ask for DDP refuses to run as several
// ranks. SHARDED stages: sharded_data_parallel_test.cc.
#include "dist/data_parallel.h"

#include <ATen/Context.h>
#include <ATen/ops/equal.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>
#include <set>
#include <thread>

#include "engine/safetensors.h"
#include "testing/data_parallel_runs.h"
#include "testing/pipelines.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using testing::DataParallelPipeline;
using testing::ExpectSameModel;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(DataParallelTest, TwoRanksWithHalfTheBatchEndWhereOneRankWithAllOfItEnds) {
  testing::TempDir tmp;
  const auto one = tmp.Write("one.pbtxt", DataParallelPipeline("one", 32, ""));
  const auto two = tmp.Write("two.pbtxt", DataParallelPipeline("two", 16, "strategy: DDP"));
  auto r1 = testing::RunEngine({"run", one.string()});
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  auto r2 = testing::RunEngine({"run", "--nproc=2", two.string()});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_THAT(r2.out, HasSubstr("world size 2"));
  EXPECT_THAT(r2.out, HasSubstr("16 examples x 1 accumulation x 2 ranks = 32 examples per step"));
  EXPECT_THAT(r2.out, HasSubstr("DDP over Gloo: this is rank 0 of 2; 719 examples per rank"));
  EXPECT_THAT(r2.out, HasSubstr("stage 's': 40 steps in "));
  // Each rank evaluated half of the 23 eval batches; the sums over both give the metrics of one
  // rank evaluating all of them.
  EXPECT_THAT(r2.out, HasSubstr("at the end, batch 16; 23 batches split across the 2 ranks"));
  std::smatch metrics;
  ASSERT_TRUE(std::regex_search(r1.out, metrics, std::regex("eval on 359 examples: [^;]*")));
  EXPECT_THAT(r2.out, HasSubstr(metrics.str()));
  EXPECT_THAT(r2.err, HasSubstr("engine run: started 2 ranks on 127.0.0.1:"));
  ExpectSameModel(tmp.path() / "one/s/final", tmp.path() / "two/s/final", /*exactly=*/false);

  // The all-reduce starts from inside the last micro-batch's backward and must still carry the
  // earlier micro-batches: 2 ranks x 2 micro-batches of 8 end at the same place too.
  const auto four = tmp.Write("four.pbtxt", DataParallelPipeline("four", 8, "strategy: DDP", 2));
  auto r4 = testing::RunEngine({"run", "--nproc=2", four.string()});
  ASSERT_EQ(r4.exit_code, 0) << r4.err;
  EXPECT_THAT(r4.out, HasSubstr("8 examples x 2 accumulation x 2 ranks = 32 examples per step"));
  ExpectSameModel(tmp.path() / "one/s/final", tmp.path() / "four/s/final", /*exactly=*/false);
}

TEST(DataParallelTest, TwoRanksWithUnevenlyMaskedConversationsEndWhereOneRankEnds) {
  // The ranks' conversations hold different numbers of assistant tokens (counted on the device):
  // the gradients are the mean over every token of both ranks, so the ranks stay equal, and equal
  // one rank with all of the conversations; so does the loss each rank reports.
  testing::TempDir tmp;
  // SHARDED (SGD's momentum, at level 2 the gradients, at level 3 the decoder layers' weights
  // split across the ranks) ends there too.
  const auto stage = [](int batch, const std::string& strategy) {
    return testing::ChatLlamaStage(
        "s",
        "precision { plugin: \"fp32\" } optimizer { sgd { momentum: 0.9 } learning_rate: 0.1 } "
        "schedule { epochs: 3 batch_size: " +
            std::to_string(batch) + " } parallel { device: \"cpu\" " + strategy +
            " } callback { plugin: \"progress\" "
            "options { [type.googleapis.com/engine.plugins.ProgressOptions] { every_steps: 1 } } "
            "}");
  };
  const auto one = tmp.Write("one.pbtxt", "output_dir: \"one\"\n" + stage(4, ""));
  const auto two = tmp.Write("two.pbtxt", "output_dir: \"two\"\n" + stage(2, "strategy: DDP"));
  const auto sharded = tmp.Write(
      "sharded.pbtxt", "output_dir: \"sharded\"\n" + stage(2, "strategy: SHARDED shard_level: 1"));
  const auto level2 = tmp.Write(
      "level2.pbtxt", "output_dir: \"level2\"\n" + stage(2, "strategy: SHARDED shard_level: 2"));
  const auto level3 = tmp.Write(
      "level3.pbtxt", "output_dir: \"level3\"\n" + stage(2, "strategy: SHARDED shard_level: 3"));
  auto r1 = testing::RunEngine({"run", one.string()});
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  for (const auto& [file, dir] : {std::pair{two, "two"}, std::pair{sharded, "sharded"},
                                  std::pair{level2, "level2"}, std::pair{level3, "level3"}}) {
    auto r2 = testing::RunEngine({"run", "--nproc=2", file.string()});
    ASSERT_EQ(r2.exit_code, 0) << r2.err;
    EXPECT_THAT(r2.out, HasSubstr("2 examples x 1 accumulation x 2 ranks = 4 examples per step"));
    ExpectSameModel(tmp.path() / "one/s/final", tmp.path() / dir / "s/final", /*exactly=*/false);
    for (const std::string step : {"1/3", "2/3", "3/3"}) {
      std::smatch loss;
      ASSERT_TRUE(std::regex_search(r1.err, loss, std::regex("step " + step + " loss [0-9.]+")));
      EXPECT_THAT(r2.err, HasSubstr(loss.str())) << dir;
    }
  }
}

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t size = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  ::close(fd);
  return ntohs(address.sin_port);
}

// Ranks 0 and 1 of a world of 2 on loopback, started as torchrun would (each with its own
// arguments), at the same time.
std::vector<testing::CommandResult> RunTwoRanksFromTheEnvironment(
    const std::vector<std::vector<std::string>>& arguments) {
  const std::string port = std::to_string(FreePort());
  std::vector<testing::CommandResult> results(2);
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      results[rank] = testing::RunEngine(arguments[rank], "",
                                         {{"RANK", std::to_string(rank)},
                                          {"LOCAL_RANK", std::to_string(rank)},
                                          {"WORLD_SIZE", "2"},
                                          {"MASTER_ADDR", "127.0.0.1"},
                                          {"MASTER_PORT", port}});
    });
  }
  for (auto& t : ranks) t.join();
  return results;
}

TEST(DataParallelTest, RanksStartedFromTheEnvironmentWriteTheCheckpointOnceFromRankZero) {
  testing::TempDir tmp;
  const auto file = tmp.Write("p.pbtxt", DataParallelPipeline("out", 16, "strategy: DDP"));
  const std::vector<testing::CommandResult> results =
      RunTwoRanksFromTheEnvironment({{"run", "-v", file.string()}, {"run", "-v", file.string()}});
  ASSERT_EQ(results[0].exit_code, 0) << results[0].err;
  ASSERT_EQ(results[1].exit_code, 0) << results[1].err;
  EXPECT_THAT(results[1].out, HasSubstr("this is rank 1 of 2"));
  EXPECT_THAT(results[0].err, HasSubstr("rank 0 evaluates 12 of 23 eval batches"));
  EXPECT_THAT(results[1].err, HasSubstr("rank 1 evaluates 11 of 23 eval batches"));
  // Rank 0 saved the periodic and final checkpoints; rank 1 neither saved nor deleted any.
  EXPECT_THAT(results[0].out, HasSubstr("checkpoint " + (tmp.path() / "out/s/final").string()));
  EXPECT_THAT(results[1].out + results[1].err, Not(HasSubstr("checkpoints/step-")));
  EXPECT_TRUE(
      std::filesystem::exists(tmp.path() / "out/s/checkpoints/step-00000030/manifest.pbtxt"));
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "out/s/final/manifest.pbtxt"));
}

TEST(DataParallelTest, RanksStartedFromDifferentPipelinesRefuseToTrainNamingTheField) {
  // Rank 1's file asks for another learning rate: both ranks stop before step 1, naming the field.
  testing::TempDir tmp;
  std::string other = DataParallelPipeline("out", 16, "strategy: SHARDED shard_level: 1");
  other.replace(other.find("learning_rate: 0.003"), 20, "learning_rate: 0.004");
  const std::filesystem::path files[2] = {
      tmp.Write("p0.pbtxt", DataParallelPipeline("out", 16, "strategy: SHARDED shard_level: 1")),
      tmp.Write("p1.pbtxt", other)};
  const std::vector<testing::CommandResult> results =
      RunTwoRanksFromTheEnvironment({{"run", files[0].string()}, {"run", files[1].string()}});
  for (const testing::CommandResult& r : results) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("stage 's': the 2 ranks do not run the same stage: "
                                 "stage[0].optimizer differs between them"));
    EXPECT_THAT(r.err, Not(HasSubstr("step 1")));
  }
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "out/s/final"));
}

// A checkpoint a callback asks for on rank 0 is taken by every rank together (it gathers each
// rank's random generators, so a rank saving alone would wait for the others forever).
TEST(DataParallelTest, ACheckpointRankZerosCallbackAsksForHoldsEveryRanksGenerators) {
  testing::TempDir tmp;
  std::string pipeline = DataParallelPipeline("out", 16, "strategy: DDP");
  pipeline.insert(pipeline.find("  parallel {"),
                  "  callback { plugin: \"checkpoint_every\" options { "
                  "[type.googleapis.com/engine.plugins.CheckpointEveryOptions] { steps: 7 } } }\n");
  const auto file = tmp.Write("p.pbtxt", pipeline);
  auto r = testing::RunEngine({"run", "--nproc=2", file.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto optimizer = tmp.path() / "out/s/checkpoints/step-00000035/optimizer.safetensors";
  auto opened = safetensors::File::Open(optimizer);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  std::set<std::string> names;
  for (const auto& info : (*opened)->tensors()) names.insert(info.name);
  EXPECT_TRUE(names.count("engine/rng/cpu")) << "rank 0's generator";
  EXPECT_TRUE(names.count("engine/rng/rank1/cpu")) << "rank 1's generator";
  // The ranks draw from their own streams.
  EXPECT_FALSE(
      at::equal(*(*opened)->Get("engine/rng/cpu"), *(*opened)->Get("engine/rng/rank1/cpu")));
}

// torchrun with one process sets WORLD_SIZE=1: the stage trains in a process group of one (what
// PyTorch's DDP does), whose average over one rank changes nothing, so it ends bit for bit where a
// plain run ends.
void ExpectOneRankGroupEqualsAPlainRun(const std::string& device, const std::string& backend) {
  testing::TempDir tmp;
  const auto plain = tmp.Write("plain.pbtxt", DataParallelPipeline("plain", 32, "", 1, device));
  const auto group =
      tmp.Write("group.pbtxt",
                DataParallelPipeline("group", 32, "strategy: DDP backend: " + backend, 1, device));
  auto r1 = testing::RunEngine({"run", plain.string()});
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  auto r2 = testing::RunEngine({"run", group.string()}, "",
                               {{"RANK", "0"},
                                {"LOCAL_RANK", "0"},
                                {"WORLD_SIZE", "1"},
                                {"MASTER_ADDR", "127.0.0.1"},
                                {"MASTER_PORT", std::to_string(FreePort())}});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  const std::string name = backend == "NCCL" ? "NCCL" : "Gloo";
  EXPECT_THAT(r2.out, HasSubstr("DDP over " + name + ": this is rank 0 of 1; 1,438 examples"));
  EXPECT_THAT(r2.out, HasSubstr("32 examples x 1 accumulation x 1 device = 32 examples per step"));
  ExpectSameModel(tmp.path() / "plain/s/final", tmp.path() / "group/s/final", /*exactly=*/true);
}

TEST(DataParallelTest, OneRankFromTheEnvironmentTrainsInAGlooGroupOfOneLikeAPlainRun) {
  ExpectOneRankGroupEqualsAPlainRun("cpu", "AUTO");
}

// On a GPU machine: NCCL with world size 1. Skipped where LibTorch has no CUDA (CI).
TEST(DataParallelTest, OneRankOnTheGpuTrainsInAnNcclGroupOfOneLikeAPlainRun) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(NcclBuiltIn()) << "a CUDA build should have found nccl.h (ENGINE_NCCL)";
  ExpectOneRankGroupEqualsAPlainRun("cuda", "NCCL");
}

TEST(DataParallelTest, NcclForACpuStageIsRefusedAtCheckTime) {
  testing::TempDir tmp;
  const auto file =
      tmp.Write("p.pbtxt", DataParallelPipeline("out", 16, "strategy: DDP backend: NCCL"));
  auto r = testing::RunEngine({"check", file.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("p.pbtxt:9:"));
  EXPECT_THAT(r.err,
              HasSubstr("stage 's': backend NCCL reduces CUDA tensors, but the stage runs on "
                        "cpu (requested); use GLOO (or AUTO, which picks Gloo there)"));
}

TEST(DataParallelTest, AStageThatDoesNotAskForDdpRefusesToRunAsSeveralRanks) {
  testing::TempDir tmp;
  const auto file = tmp.Write("p.pbtxt", DataParallelPipeline("out", 16, ""));
  auto r = testing::RunEngine({"run", "--nproc=2", file.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("it would run as rank 1 of WORLD_SIZE=2, but the stage does not "
                               "ask for parallel { strategy: DDP }"));
  // Refused by the launcher's check, before any rank started.
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("started 2 ranks")));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "out/s/final"));
}

}  // namespace
}  // namespace engine
