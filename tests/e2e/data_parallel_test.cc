// DDP over Gloo on loopback: two ranks with half the batch each end where one rank with
// the whole batch ends; the plan shows the ranks; ranks started by hand (as torchrun does) write
// the checkpoint once, from rank 0; a stage that does not ask for DDP refuses to run as several
// ranks. SHARDED stages end where DDP ends, resume, and shard levels that cannot run are refused.
#include "dist/data_parallel.h"

#include <ATen/Context.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <regex>
#include <set>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_tensors.h"
#include "checkpoint/tensor_pieces.h"
#include "core/remove_tree.h"
#include "engine/safetensors.h"
#include "testing/pipelines.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string DataParallelPipeline(const std::string& out, int batch, const std::string& parallel,
                                 int accumulation = 1, const std::string& device = "cpu",
                                 const std::string& precision = "fp32") {
  return "output_dir: \"" + out +
         "\"\nstage {\n  name: \"s\"\n"
         "  model { plugin: \"mlp\" options { [type.googleapis.com/engine.plugins.MlpOptions] { "
         "hidden_units: 64 } } }\n"
         "  data { plugin: \"digits\" options { [type.googleapis.com/engine.plugins."
         "DigitsOptions] { path: \"" +
         testing::DigitsDataPath().string() +
         "\" } } }\n"
         "  precision { plugin: \"" +
         precision +
         "\" }\n"
         "  optimizer { learning_rate: 0.003 }\n"
         "  schedule { max_steps: 40 batch_size: " +
         std::to_string(batch) + " gradient_accumulation_steps: " + std::to_string(accumulation) +
         " checkpoint_every_steps: 10 }\n  parallel { device: \"" + device + "\" " + parallel +
         " }\n}\n";
}

// Two safetensors files (weights, or optimizer state) hold the same names, every tensor equal or
// (with a tolerance) close.
void ExpectSameWeights(const std::filesystem::path& a, const std::filesystem::path& b,
                       bool exactly) {
  auto x = safetensors::File::Open(a);
  auto y = safetensors::File::Open(b);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_EQ((*x)->tensors().size(), (*y)->tensors().size());
  for (const auto& info : (*x)->tensors()) {
    const at::Tensor u = *(*x)->Get(info.name);
    const at::Tensor v = *(*y)->Get(info.name);
    // Sums over 32 examples split 16 + 16 across ranks round differently from one sum of 32; after
    // 40 AdamW steps the weights agree to about 1e-6.
    EXPECT_TRUE(exactly ? at::equal(u, v) : at::allclose(u, v, 1e-4, 1e-5)) << info.name;
  }
}

// A checkpoint's optimizer state by name, whole: optimizer.safetensors's tensors, and a sharded
// stage's slots and masters assembled from its ranks' files.
std::map<std::string, at::Tensor> OptimizerStateOf(const std::filesystem::path& checkpoint) {
  std::map<std::string, at::Tensor> state;
  auto file = safetensors::File::Open(checkpoint / "optimizer.safetensors");
  EXPECT_TRUE(file.ok()) << checkpoint;
  if (!file.ok()) return state;
  const auto tensors = (*file)->GetAll();
  EXPECT_TRUE(tensors.ok());
  for (const auto& [name, tensor] : *tensors) state[name] = tensor;
  auto manifest = ReadManifest(checkpoint);
  EXPECT_TRUE(manifest.ok());
  const auto names = RankFiles(*manifest, RankFile::kOptimizerState);
  EXPECT_TRUE(names.ok());
  std::vector<std::filesystem::path> ranks;
  for (const std::string& name : *names) ranks.push_back(checkpoint / name);
  auto pieces = TensorPieces::Open(ranks);
  EXPECT_TRUE(pieces.ok()) << pieces.status().message();
  for (const std::string& name : pieces->names()) {
    EXPECT_EQ(state.count(name), 0u) << name << " is stored twice";
    state[name] = *pieces->Whole(name);
  }
  return state;
}

// Two checkpoints hold the same model tensors, wherever each stores them (CheckpointTensors).
void ExpectSameModel(const std::filesystem::path& a, const std::filesystem::path& b) {
  auto x_manifest = ReadManifest(a);
  auto y_manifest = ReadManifest(b);
  ASSERT_TRUE(x_manifest.ok() && y_manifest.ok());
  auto x = CheckpointTensors::Open(a, *x_manifest);
  auto y = CheckpointTensors::Open(b, *y_manifest);
  ASSERT_TRUE(x.ok()) << x.status().message();
  ASSERT_TRUE(y.ok()) << y.status().message();
  ASSERT_EQ(x->tensors().size(), y->tensors().size());
  for (const auto& info : x->tensors()) {
    auto u = x->Get(info.name);
    auto v = y->Get(info.name);
    ASSERT_TRUE(u.ok() && v.ok()) << info.name;
    EXPECT_TRUE(at::equal(*u, *v)) << info.name;
  }
}

// Two checkpoints hold the same optimizer state, whichever files it is in.
void ExpectSameOptimizerState(const std::filesystem::path& a, const std::filesystem::path& b,
                              bool exactly) {
  const std::map<std::string, at::Tensor> x = OptimizerStateOf(a);
  const std::map<std::string, at::Tensor> y = OptimizerStateOf(b);
  ASSERT_EQ(x.size(), y.size());
  for (const auto& [name, u] : x) {
    auto it = y.find(name);
    ASSERT_NE(it, y.end()) << name;
    EXPECT_TRUE(exactly ? at::equal(u, it->second) : at::allclose(u, it->second, 1e-4, 1e-5))
        << name;
  }
}

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
  ExpectSameWeights(tmp.path() / "one/s/final/model.safetensors",
                    tmp.path() / "two/s/final/model.safetensors", /*exactly=*/false);

  // The all-reduce starts from inside the last micro-batch's backward and must still carry the
  // earlier micro-batches: 2 ranks x 2 micro-batches of 8 end at the same place too.
  const auto four = tmp.Write("four.pbtxt", DataParallelPipeline("four", 8, "strategy: DDP", 2));
  auto r4 = testing::RunEngine({"run", "--nproc=2", four.string()});
  ASSERT_EQ(r4.exit_code, 0) << r4.err;
  EXPECT_THAT(r4.out, HasSubstr("8 examples x 2 accumulation x 2 ranks = 32 examples per step"));
  ExpectSameWeights(tmp.path() / "one/s/final/model.safetensors",
                    tmp.path() / "four/s/final/model.safetensors", /*exactly=*/false);
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
    ExpectSameWeights(tmp.path() / "one/s/final/model.safetensors",
                      tmp.path() / dir / "s/final/model.safetensors", /*exactly=*/false);
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
  ExpectSameWeights(tmp.path() / "plain/s/final/model.safetensors",
                    tmp.path() / "group/s/final/model.safetensors", /*exactly=*/true);
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

TEST(ShardedDataParallelTest, ShardedRanksEndWhereDdpAndOneRankEnd) {
  // SHARDED at level 1 splits AdamW's moments across the ranks and changes no number: each rank
  // runs DDP's update on its part of every tensor, so 2 ranks end bit for bit where DDP's 2 ranks
  // end, and 4 ranks of 8 where one rank of 32 ends (within rounding: the gradients are summed in
  // another order). The checkpoint holds the optimizer state under DDP's names, in each rank's
  // own file.
  testing::TempDir tmp;
  const auto one = tmp.Write("one.pbtxt", DataParallelPipeline("one", 32, ""));
  const auto ddp = tmp.Write("ddp.pbtxt", DataParallelPipeline("ddp", 16, "strategy: DDP"));
  const auto two =
      tmp.Write("two.pbtxt", DataParallelPipeline("two", 16, "strategy: SHARDED shard_level: 1"));
  const auto four =
      tmp.Write("four.pbtxt", DataParallelPipeline("four", 8, "strategy: SHARDED shard_level: 1"));
  auto r1 = testing::RunEngine({"run", one.string()});
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  auto rd = testing::RunEngine({"run", "--nproc=2", ddp.string()});
  ASSERT_EQ(rd.exit_code, 0) << rd.err;
  auto r2 = testing::RunEngine({"run", "--nproc=2", two.string()});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  auto r4 = testing::RunEngine({"run", "--nproc=4", "--oversubscribe", four.string()});
  ASSERT_EQ(r4.exit_code, 0) << r4.err;
  EXPECT_THAT(r2.out, HasSubstr("SHARDED (shard_level 1: the optimizer state split across the "
                                "ranks) over Gloo: this is rank 0 of 2"));
  // The mlp's 4,810 trainable f32 elements: AdamW's two moments are 38,480 bytes, a quarter each.
  EXPECT_THAT(rd.out, HasSubstr("optimizer state 38.5 KB, all-reduce buckets 19.2 KB"));
  EXPECT_THAT(
      r4.out,
      HasSubstr("per rank: model 19.2 KB, gradients 19.2 KB, f32 masters 0 B, "
                "optimizer state 9.6 KB (1/4 of 38.5 KB, and of the masters: shard_level 1)"));
  const std::filesystem::path weights = "s/final/model.safetensors";
  ExpectSameWeights(tmp.path() / "ddp" / weights, tmp.path() / "two" / weights, /*exactly=*/true);
  ExpectSameWeights(tmp.path() / "one" / weights, tmp.path() / "four" / weights,
                    /*exactly=*/false);
  const std::filesystem::path state = "s/checkpoints/step-00000030";
  ExpectSameOptimizerState(tmp.path() / "ddp" / state, tmp.path() / "two" / state,
                           /*exactly=*/true);
}

TEST(ShardedDataParallelTest, ShardedBf16RanksSplitTheMastersAndEndWhereDdpEnds) {
  // bf16-true: the weights are bf16 and their f32 masters are the optimizer's, each rank keeping
  // those of its part. The weights, moments and masters end bit for bit where DDP's end, and the
  // checkpoint holds the masters under DDP's names.
  testing::TempDir tmp;
  const std::string sharded = "strategy: SHARDED shard_level: 1";
  const auto ddp = tmp.Write(
      "ddp.pbtxt", DataParallelPipeline("ddp", 16, "strategy: DDP", 1, "cpu", "bf16-true"));
  const auto two =
      tmp.Write("two.pbtxt", DataParallelPipeline("two", 16, sharded, 1, "cpu", "bf16-true"));
  auto rd = testing::RunEngine({"run", "--nproc=2", ddp.string()});
  ASSERT_EQ(rd.exit_code, 0) << rd.err;
  auto r2 = testing::RunEngine({"run", "--nproc=2", two.string()});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_THAT(rd.out, HasSubstr("model 9.6 KB, gradients 9.6 KB, f32 masters 19.2 KB"));
  EXPECT_THAT(r2.out, HasSubstr("model 9.6 KB, gradients 9.6 KB, f32 masters 9.6 KB"));
  const std::filesystem::path weights = "s/final/model.safetensors";
  ExpectSameWeights(tmp.path() / "ddp" / weights, tmp.path() / "two" / weights, /*exactly=*/true);
  const std::filesystem::path state = "s/checkpoints/step-00000030";
  ExpectSameOptimizerState(tmp.path() / "ddp" / state, tmp.path() / "two" / state,
                           /*exactly=*/true);
  int masters = 0;
  for (const auto& [name, tensor] : OptimizerStateOf(tmp.path() / "two" / state)) {
    if (name.size() > 7 && name.substr(name.size() - 7) == ".master") ++masters;
  }
  EXPECT_EQ(masters, 4) << "the MLP's two weights and two biases";
  // Nothing was gathered on rank 0: its optimizer.safetensors holds the training state only, and
  // each rank's file its parts (the two bias and two weight tensors' moments and masters).
  auto rank0 = safetensors::File::Open(tmp.path() / "two" / state / "optimizer.safetensors");
  ASSERT_TRUE(rank0.ok());
  for (const auto& info : (*rank0)->tensors()) {
    EXPECT_EQ(info.name.rfind("engine/rng/", 0), 0u) << info.name << " was gathered on rank 0";
  }
  for (int rank : {0, 1}) {
    auto mine = safetensors::File::Open(tmp.path() / "two" / state /
                                        RankFileName(RankFile::kOptimizerState, rank, 2));
    ASSERT_TRUE(mine.ok()) << rank;
    EXPECT_FALSE((*mine)->tensors().empty());
  }
}

TEST(ShardedDataParallelTest, AShardedStageResumesBitForBitFromItsCheckpoint) {
  // Trained to the end, then as if killed after step 30: the final checkpoint and step 40's are
  // gone, and the same command resumes after step 30 on 2 ranks to the same weights, bit for bit
  // (bf16-true, so the masters each rank keeps come back too, from each rank's file; at level 3
  // the restored weights go back into each rank's parts). At level 1, rank 1's file of step 30 is
  // then damaged: the resume names it and goes on from step 20 instead, to the same weights.
  for (const std::string level : {"1", "3"}) {
    testing::TempDir tmp;
    const auto file = tmp.Write(
        "p.pbtxt", DataParallelPipeline("out", 16, "strategy: SHARDED shard_level: " + level, 1,
                                        "cpu", "bf16-true"));
    auto r = testing::RunEngine({"run", "--nproc=2", file.string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::filesystem::path stage = tmp.path() / "out/s";
    std::filesystem::copy_file(stage / "final/model.safetensors", tmp.path() / "reference");
    std::error_code ec;
    RemoveTree(stage / "final", ec);
    RemoveTree(stage / "checkpoints/step-00000040", ec);
    ASSERT_TRUE(std::filesystem::exists(stage / "checkpoints/step-00000030"));
    r = testing::RunEngine({"run", "--nproc=2", file.string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("stage 's': resuming after step 30 of 40"));
    ExpectSameWeights(tmp.path() / "reference", stage / "final/model.safetensors",
                      /*exactly=*/true);
    if (level != "1") continue;
    RemoveTree(stage / "final", ec);
    RemoveTree(stage / "checkpoints/step-00000040", ec);
    const std::filesystem::path rank1 =
        stage / "checkpoints/step-00000030" / RankFileName(RankFile::kOptimizerState, 1, 2);
    std::filesystem::resize_file(rank1, std::filesystem::file_size(rank1) - 1);
    r = testing::RunEngine({"run", "--nproc=2", file.string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("step-00000030 is damaged (" + rank1.string() + " is "));
    EXPECT_THAT(r.out, HasSubstr("stage 's': resuming after step 20 of 40"));
    ExpectSameWeights(tmp.path() / "reference", stage / "final/model.safetensors",
                      /*exactly=*/true);
  }
}

TEST(ShardedDataParallelTest, ShardLevelsTwoAndThreeEndWhereDdpEnds) {
  // Level 2 reduce-scatters each gradient into the rank that owns its part, and the parts hold
  // DDP's averaged elements exactly. Level 3 also keeps each rank's part of the hidden layer's
  // weights only (the head, outside the blocks, stays whole) and gathers them for the layer's
  // forward and again for its backward, which recomputes the layer. Both are DDP's arithmetic: 2
  // ranks end bit for bit where DDP's 2 ranks end, in f32 and in bf16-true (masters and moments
  // too), and 4 ranks of 8 where one rank of 32 ends.
  testing::TempDir tmp;
  const auto one = tmp.Write("one.pbtxt", DataParallelPipeline("one", 32, ""));
  const auto ddp = tmp.Write("ddp.pbtxt", DataParallelPipeline("ddp", 16, "strategy: DDP"));
  const auto ddp_bf16 =
      tmp.Write("ddp_bf16.pbtxt",
                DataParallelPipeline("ddp_bf16", 16, "strategy: DDP", 1, "cpu", "bf16-true"));
  for (const auto& file : {ddp, ddp_bf16}) {
    auto r = testing::RunEngine({"run", "--nproc=2", file.string()});
    ASSERT_EQ(r.exit_code, 0) << file << r.err;
  }
  auto r1 = testing::RunEngine({"run", one.string()});
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  const std::filesystem::path weights = "s/final/model.safetensors";
  const std::filesystem::path state = "s/checkpoints/step-00000030";
  for (const std::string level : {"2", "3"}) {
    const std::string parallel = "strategy: SHARDED shard_level: " + level;
    const std::string two = "two" + level;
    const std::string four = "four" + level;
    for (const std::string precision : {"fp32", "bf16-true"}) {
      const std::string out = two + (precision == "fp32" ? "" : "_bf16");
      const auto file =
          tmp.Write(out + ".pbtxt", DataParallelPipeline(out, 16, parallel, 1, "cpu", precision));
      auto r = testing::RunEngine({"run", "--nproc=2", file.string()});
      ASSERT_EQ(r.exit_code, 0) << file << r.err;
      if (precision != "fp32") continue;
      if (level == "2") {
        EXPECT_THAT(r.out, HasSubstr("SHARDED (shard_level 2: the optimizer state and the "
                                     "gradients split across the ranks) over Gloo: this is rank 0 "
                                     "of 2"));
        EXPECT_THAT(r.out, HasSubstr("gradients reduce-scattered and weights all-gathered in "
                                     "buckets of 4.2 MB"));
        // Half of the 19.2 KB of gradients; the f32 parts (9.6 KB) and 4 buffers of the one
        // bucket the 4,810 elements fill (77.0 KB).
        EXPECT_THAT(r.out,
                    HasSubstr("per rank: model 19.2 KB, gradients 9.6 KB, f32 masters 0 B, "
                              "optimizer state 19.2 KB (1/2 of 38.5 KB, and of the masters "
                              "and gradients: shard_level 2), reduce-scatter buffers 86.6 KB"));
      } else {
        EXPECT_THAT(r.out, HasSubstr("SHARDED (shard_level 3: the optimizer state, the gradients "
                                     "and the trainable parameters of the model's 1 block split "
                                     "across the ranks) over Gloo: this is rank 0 of 2"));
        EXPECT_THAT(r.out, HasSubstr("each block's weights gathered for its forward and again for "
                                     "its backward, which recomputes it"));
        // Of the 19.2 KB of weights, the hidden layer's 16.6 KB are split: 2.6 KB of head and
        // 8.3 KB of parts.
        EXPECT_THAT(r.out, HasSubstr("per rank: model 10.9 KB, gradients 9.6 KB"));
        EXPECT_THAT(r.out, HasSubstr("gathered blocks 16.6 KB (of 16.6 KB in 1 block)"));
      }
    }
    auto r4 = testing::RunEngine(
        {"run", "--nproc=4", "--oversubscribe",
         tmp.Write(four + ".pbtxt", DataParallelPipeline(four, 8, parallel)).string()});
    ASSERT_EQ(r4.exit_code, 0) << r4.err;
    for (const std::string name : {"", "_bf16"}) {
      ExpectSameWeights(tmp.path() / ("ddp" + name) / weights, tmp.path() / (two + name) / weights,
                        /*exactly=*/true);
      ExpectSameOptimizerState(tmp.path() / ("ddp" + name) / state,
                               tmp.path() / (two + name) / state, /*exactly=*/true);
      ExpectSameModel(tmp.path() / ("ddp" + name) / state, tmp.path() / (two + name) / state);
    }
    if (level == "3") {
      // The periodic checkpoints gather nothing: each rank wrote its parts of the hidden layer's
      // weight and bias, and model.safetensors holds the head only (the final one is whole); a
      // resume reads them together as DDP's weights (ExpectSameModel above).
      const std::filesystem::path periodic = tmp.path() / two / state;
      auto head_only = safetensors::File::Open(periodic / "model.safetensors");
      ASSERT_TRUE(head_only.ok());
      EXPECT_EQ((*head_only)->tensors().size(), 2u);
      for (int rank : {0, 1}) {
        EXPECT_TRUE(std::filesystem::exists(periodic / RankFileName(RankFile::kWeights, rank, 2)));
      }
      auto generate = testing::RunEngine({"generate", periodic.string(), "--prompt=hi"});
      EXPECT_EQ(generate.exit_code, 1);
      EXPECT_THAT(generate.err,
                  HasSubstr("is a periodic checkpoint of stage 's' whose ranks each wrote their "
                            "parts of the weights (model-rank-00000-of-00002.safetensors, ...; "
                            "parallel.shard_level 3), not a model directory: use the stage's "
                            "final checkpoint"));
    }
    ExpectSameWeights(tmp.path() / "one" / weights, tmp.path() / four / weights,
                      /*exactly=*/false);
  }
}

TEST(ShardedDataParallelTest, QloraAtShardLevelsTwoAndThreeEndsWhereDdpEnds) {
  // LoRA on an NF4 base: only the adapters train, so only they are laid out, reduce-scattered and
  // all-gathered (at level 3 each decoder layer's adapters while the layer runs); the 4-bit base
  // is whole on every rank and never sent. The adapters and their AdamW state end bit for bit
  // where DDP's end.
  testing::TempDir tmp;
  const auto stage = [](const std::string& strategy) {
    return testing::ChatLlamaStage(
        "s",
        "quantizer { plugin: \"nf4\" options { [type.googleapis.com/engine.plugins.Nf4Options] { "
        "target_modules: \"model.layers.*\" } } }\n"
        "adapter { plugin: \"lora\" options { [type.googleapis.com/engine.plugins.LoraOptions] { "
        "r: 4 lora_alpha: 8 target_modules: \"q_proj\" target_modules: \"v_proj\" } } }\n"
        "precision { plugin: \"fp32\" } optimizer { learning_rate: 0.01 } "
        "schedule { epochs: 3 batch_size: 2 checkpoint_every_steps: 2 } parallel { device: "
        "\"cpu\" " +
            strategy + " }");
  };
  const auto ddp = tmp.Write("ddp.pbtxt", "output_dir: \"ddp\"\n" + stage("strategy: DDP"));
  const auto level2 = tmp.Write(
      "level2.pbtxt", "output_dir: \"level2\"\n" + stage("strategy: SHARDED shard_level: 2"));
  const auto level3 = tmp.Write(
      "level3.pbtxt", "output_dir: \"level3\"\n" + stage("strategy: SHARDED shard_level: 3"));
  for (const auto& file : {ddp, level2, level3}) {
    auto r = testing::RunEngine({"run", "--nproc=2", file.string()});
    ASSERT_EQ(r.exit_code, 0) << file << r.err;
    if (file == level3) {
      EXPECT_THAT(r.out, HasSubstr("the trainable parameters of the model's 2 blocks split across "
                                   "the ranks"));
    }
  }
  for (const std::string level : {"level2", "level3"}) {
    ExpectSameWeights(tmp.path() / "ddp/s/final/model.safetensors",
                      tmp.path() / level / "s/final/model.safetensors", /*exactly=*/true);
    ExpectSameOptimizerState(tmp.path() / "ddp/s/checkpoints/step-00000002",
                             tmp.path() / level / "s/checkpoints/step-00000002",
                             /*exactly=*/true);
    // At level 3 the adapters are in the ranks' weight files (no adapter file is written beside
    // them); read back together they are DDP's.
    ExpectSameModel(tmp.path() / "ddp/s/checkpoints/step-00000002",
                    tmp.path() / level / "s/checkpoints/step-00000002");
  }
}

TEST(ShardedDataParallelTest, ShardLevelsTwoAndThreeSkipTheOverflowsDdpSkipsAndClipAsItClips) {
  // Under loss scaling that overflows (scaled_fp32 from a scale of 1e37), with two micro-batches
  // per step and clipping, each level-2 rank checks and measures only its parts: the ranks sum
  // their overflow flags and squared norms, so they skip the steps DDP skips (an overflow in one
  // rank's parts stops every rank) and clip by the same norm. The norm is summed from parts in
  // another order than DDP's, so the weights agree within rounding.
  testing::TempDir tmp;
  auto pipeline = [&](const std::string& out, const std::string& parallel) {
    std::string text = "plugin_path: \"" + std::string(testing::kTestPluginDir) +
                       "/scaled_fp32\"\n" +
                       DataParallelPipeline(out, 8, parallel, /*accumulation=*/2);
    const std::string precision = "  precision { plugin: \"fp32\" }\n";
    text.replace(text.find(precision), precision.size(),
                 testing::Precision("scaled_fp32",
                                    "loss_scaling { initial_scale: 1e37 growth_interval: 3 }"));
    const std::string optimizer = "optimizer { learning_rate: 0.003 }";
    text.replace(text.find(optimizer), optimizer.size(),
                 "optimizer { learning_rate: 0.003 max_grad_norm: 0.05 }");
    return tmp.Write(out + ".pbtxt", text);
  };
  const auto ddp = pipeline("ddp", "strategy: DDP");
  const auto two = pipeline("two", "strategy: SHARDED shard_level: 2");
  const auto three = pipeline("three", "strategy: SHARDED shard_level: 3");
  auto rd = testing::RunEngine({"run", "--nproc=2", ddp.string()});
  ASSERT_EQ(rd.exit_code, 0) << rd.err;
  auto r2 = testing::RunEngine({"run", "--nproc=2", two.string()});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  auto r3 = testing::RunEngine({"run", "--nproc=2", three.string()});
  ASSERT_EQ(r3.exit_code, 0) << r3.err;
  auto overflows = [](const std::string& log) {
    const std::regex skipped("step [0-9]+ overflowed at loss scale [^;]*; skipped");
    std::set<std::string> steps;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), skipped);
         it != std::sregex_iterator(); ++it) {
      steps.insert(it->str());
    }
    return steps;
  };
  EXPECT_FALSE(overflows(rd.err).empty());
  EXPECT_EQ(overflows(rd.err), overflows(r2.err));
  EXPECT_EQ(overflows(rd.err), overflows(r3.err));
  ExpectSameWeights(tmp.path() / "ddp/s/final/model.safetensors",
                    tmp.path() / "two/s/final/model.safetensors", /*exactly=*/false);
  // Level 3 as level 2, its blocks' first micro-batch gradients kept whole until the second.
  ExpectSameWeights(tmp.path() / "ddp/s/final/model.safetensors",
                    tmp.path() / "three/s/final/model.safetensors", /*exactly=*/false);
}

TEST(ShardedDataParallelTest, ShardLevelsThatCannotRunAreRefusedAtCheckTimeNamingTheField) {
  testing::TempDir tmp;
  const struct {
    std::string parallel, message;
  } cases[] = {
      {"strategy: SHARDED",
       "stage 's': strategy: SHARDED needs parallel.shard_level; shard_level: 1 splits the "
       "optimizer state across the ranks, 2 the gradients too, 3 the parameters too"},
      {"strategy: SHARDED shard_level: 4", "stage 's': parallel.shard_level 4 does not exist"},
      {"strategy: DDP shard_level: 1",
       "stage 's': parallel.shard_level applies to strategy: SHARDED only; this stage's strategy "
       "is DDP"},
  };
  for (const auto& c : cases) {
    const auto file = tmp.Write("p.pbtxt", DataParallelPipeline("out", 16, c.parallel));
    auto r = testing::RunEngine({"check", file.string()});
    EXPECT_EQ(r.exit_code, 1) << c.parallel;
    EXPECT_THAT(r.err, HasSubstr("p.pbtxt:9:")) << c.parallel;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.parallel;
  }
}

TEST(ShardedDataParallelTest,
     AStageResumesAtAnotherWorldSizeOnTheSameScheduleAndNamesTheWayOtherwise) {
  // 2 ranks of 16 at shard_level 3, 50 steps, as if killed after step 30. Each rank takes every
  // world_size-th example of the epoch's order, so 4 ranks of 8, or one process of 32, take the
  // same 32 examples in each step, and with drop_last the same first 1,408 of each epoch (44 steps;
  // the resumed run goes on into the second epoch): the stage has the same fingerprint, resumes
  // after step 30 and ends where the 2 ranks ended (within the rounding of sums split another
  // way). 4 ranks of 16 would take 64 per step: that run is refused with the way out, never
  // started over.
  testing::TempDir tmp;
  const std::string level3 = "strategy: SHARDED shard_level: 3";
  auto pipeline = [&](int batch) {
    std::string text = DataParallelPipeline("out", batch, level3);
    const std::string schedule = "schedule { max_steps: 40 ";
    text.replace(text.find(schedule), schedule.size(), "schedule { drop_last: true max_steps: 50 ");
    return tmp.Write("p" + std::to_string(batch) + ".pbtxt", text);
  };
  auto r = testing::RunEngine({"run", "--nproc=2", pipeline(16).string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::filesystem::path stage = tmp.path() / "out/s";
  std::filesystem::copy_file(stage / "final/model.safetensors", tmp.path() / "reference");
  auto as_if_killed_after_step_30 = [&] {
    std::error_code ec;
    RemoveTree(stage / "final", ec);
    RemoveTree(stage / "checkpoints/step-00000040", ec);
    RemoveTree(stage / "checkpoints/step-00000050", ec);
    ASSERT_TRUE(std::filesystem::exists(stage / "checkpoints/step-00000030"));
  };
  const struct {
    std::vector<std::string> command;
    int batch;
  } resumes[] = {{{"run", "--nproc=4", "--oversubscribe"}, 8}, {{"run"}, 32}};
  for (const auto& resume : resumes) {
    as_if_killed_after_step_30();
    std::vector<std::string> command = resume.command;
    command.push_back(pipeline(resume.batch).string());
    r = testing::RunEngine(command);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("stage 's': resuming after step 30 of 50")) << resume.batch;
    ExpectSameWeights(tmp.path() / "reference", stage / "final/model.safetensors",
                      /*exactly=*/false);
  }
  as_if_killed_after_step_30();
  r = testing::RunEngine({"run", "--nproc=4", "--oversubscribe", pipeline(16).string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(
      r.err,
      HasSubstr("stage 's': its checkpoint " + (stage / "checkpoints/step-00000030").string() +
                " (after step 30 of 50) was written by 2 ranks of batch_size 16 x 1 "
                "accumulation: 32 examples per step, 44 steps per epoch of 1408 examples; 4 "
                "ranks of batch_size 16 x 1 make 64, 22 and 1408. To go on, set "
                "schedule.batch_size to 8 to resume from it at 4 ranks, or run with "
                "--force=s to train the stage again from step 0"));
  EXPECT_FALSE(std::filesystem::exists(stage / "final"));
  // No batch size makes steps of 32 at 3 ranks.
  r = testing::RunEngine({"run", "--nproc=3", "--oversubscribe", pipeline(16).string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("To go on, resume from it at 2 ranks of batch_size 16 x 1 "
                               "accumulation (neither batch_size nor accumulation alone makes that "
                               "schedule at 3 ranks)"));
}

TEST(ShardedDataParallelTest, ShardLevelThreeOnAModelWithoutBlocksIsRefusedNamingTheField) {
  testing::TempDir tmp;
  std::string text = testing::ReadText(std::filesystem::path(testing::kSourceDir) /
                                       "pipelines/digits_vlm_single.pbtxt");
  const std::string data = "\"../data/";
  text.replace(text.find(data), data.size(), "\"" + std::string(testing::kSourceDir) + "/data/");
  const std::string callback = "  callback { plugin: \"progress\" }";
  text.replace(text.find(callback), callback.size(),
               "  parallel { device: \"cpu\" strategy: SHARDED shard_level: 3 }");
  const auto file = tmp.Write("vlm.pbtxt", text);
  auto r = testing::RunEngine({"check", file.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("stage 'vlm': parallel.shard_level 3 gathers the model's "
                               "parameters one block at a time, and model 'vlm' names no blocks"));
  EXPECT_THAT(r.err, HasSubstr("vlm.pbtxt:44:46: error:"));  // the shard_level field
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
