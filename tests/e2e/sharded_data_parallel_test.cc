// SHARDED stages over Gloo on loopback (ZeRO's optimizer, gradient and parameter sharding at
// parallel.shard_level 1, 2 and 3): they end where DDP ends (bit for bit where the sums are the
// same), in f32 and bf16, with QLoRA, skipping the overflows DDP skips and clipping as it clips;
// their checkpoints hold each rank's parts and resume bit for bit, at another world size too,
// passing over a damaged rank file; shard levels that cannot run are refused at check time naming
// the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>
#include <string>

#include "checkpoint/checkpoint.h"
#include "core/remove_tree.h"
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
using testing::ExpectSameOptimizerState;
using testing::ExpectSameWeights;
using ::testing::HasSubstr;
using testing::OptimizerStateOf;

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
  const std::filesystem::path final_dir = "s/final";
  ExpectSameModel(tmp.path() / "ddp" / final_dir, tmp.path() / "two" / final_dir, /*exactly=*/true);
  ExpectSameModel(tmp.path() / "one" / final_dir, tmp.path() / "four" / final_dir,
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
  const std::filesystem::path final_dir = "s/final";
  ExpectSameModel(tmp.path() / "ddp" / final_dir, tmp.path() / "two" / final_dir, /*exactly=*/true);
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
    std::filesystem::copy(stage / "final", tmp.path() / "reference",
                          std::filesystem::copy_options::recursive);
    std::error_code ec;
    RemoveTree(stage / "final", ec);
    RemoveTree(stage / "checkpoints/step-00000040", ec);
    ASSERT_TRUE(std::filesystem::exists(stage / "checkpoints/step-00000030"));
    r = testing::RunEngine({"run", "--nproc=2", file.string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("stage 's': resuming after step 30 of 40"));
    ExpectSameModel(tmp.path() / "reference", stage / "final",
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
    ExpectSameModel(tmp.path() / "reference", stage / "final",
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
  const std::filesystem::path final_dir = "s/final";
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
      ExpectSameModel(tmp.path() / ("ddp" + name) / final_dir,
                      tmp.path() / (two + name) / final_dir,
                      /*exactly=*/true);
      ExpectSameOptimizerState(tmp.path() / ("ddp" + name) / state,
                               tmp.path() / (two + name) / state, /*exactly=*/true);
      ExpectSameModel(tmp.path() / ("ddp" + name) / state, tmp.path() / (two + name) / state);
    }
    if (level == "3") {
      // The checkpoints gather nothing, the final one included: each rank wrote its parts of the
      // hidden layer's weight and bias, and model.safetensors holds the head only; a resume and
      // a later stage read them together as DDP's weights (ExpectSameModel above).
      for (const std::filesystem::path& dir : {state, final_dir}) {
        const std::filesystem::path written = tmp.path() / two / dir;
        auto head_only = safetensors::File::Open(written / "model.safetensors");
        ASSERT_TRUE(head_only.ok());
        EXPECT_EQ((*head_only)->tensors().size(), 2u) << dir;
        for (int rank : {0, 1}) {
          EXPECT_TRUE(std::filesystem::exists(written / RankFileName(RankFile::kWeights, rank, 2)))
              << dir;
        }
      }
      const std::filesystem::path periodic = tmp.path() / two / state;
      auto generate = testing::RunEngine({"generate", periodic.string(), "--prompt=hi"});
      EXPECT_EQ(generate.exit_code, 1);
      EXPECT_THAT(generate.err,
                  HasSubstr("is a checkpoint of stage 's' whose ranks each wrote their parts of "
                            "the weights (model-rank-00000-of-00002.safetensors, ...; "
                            "parallel.shard_level 3), not a model directory: use the stage, as "
                            "in `engine generate PIPELINE.pbtxt:s --checkpoint " +
                            periodic.string() + "`, or `engine export` it"));
    }
    ExpectSameModel(tmp.path() / "one" / final_dir, tmp.path() / four / final_dir,
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
    ExpectSameModel(tmp.path() / "ddp/s/final", tmp.path() / level / "s/final", /*exactly=*/true);
    ExpectSameOptimizerState(tmp.path() / "ddp/s/checkpoints/step-00000002",
                             tmp.path() / level / "s/checkpoints/step-00000002",
                             /*exactly=*/true);
    // At level 3 the adapters are in the ranks' weight files (no adapter file is written beside
    // them); read back together they are DDP's.
    ExpectSameModel(tmp.path() / "ddp/s/checkpoints/step-00000002",
                    tmp.path() / level / "s/checkpoints/step-00000002");
  }
  // The final checkpoint gathers the adapters, which are all the stage trains, and writes them
  // whole into PEFT's adapter file too, which a stage that merges them reads.
  const std::filesystem::path final_dir = tmp.path() / "level3/s/final";
  EXPECT_TRUE(std::filesystem::exists(final_dir / "adapter_model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(final_dir / RankFileName(RankFile::kWeights, 0, 2)));
}

TEST(ShardedDataParallelTest,
     ShardLevelThreeEvaluatesBlockByBlockAndItsFinalCheckpointInPartsIsReadLikeAnyOther) {
  // A full fine-tune of a small Llama on chat data, then a stage from it, on 2 ranks. At level 3
  // the evaluation gathers one block at a time as training does (3 eval batches: rank 1 runs its
  // one batch twice, the second uncounted, so that both ranks make the same gathers), and the
  // final checkpoint is each rank's parts of the decoder layers beside rank 0's other tensors:
  // nothing makes the whole model on a rank. The metrics are DDP's, and `engine eval`, `engine
  // generate` and `engine export` of the stage, and the stage after it, read the checkpoint as
  // DDP's; run again, the stages are up to date.
  testing::TempDir tmp;
  auto pipeline = [&](const std::string& out, const std::string& strategy) {
    const std::string fields =
        "precision { plugin: \"fp32\" } optimizer { learning_rate: 0.01 } schedule { epochs: 2 "
        "batch_size: 1 eval_batch_size: 1 } parallel { device: \"cpu\" " +
        strategy + " }";
    return tmp.Write(out + ".pbtxt",
                     "output_dir: \"" + out + "\"\n" + testing::ChatLlamaStage("s", fields, "0.5") +
                         testing::ChatLlamaStage("t", "from_stage: \"s\" " + fields, "0.5"));
  };
  const auto ddp = pipeline("ddp", "strategy: DDP");
  const auto three = pipeline("three", "strategy: SHARDED shard_level: 3");
  std::string eval_lines[2];
  for (int i = 0; i < 2; ++i) {
    auto r = testing::RunEngine({"run", "--nproc=2", (i == 0 ? ddp : three).string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("3 batches split across the 2 ranks"));
    const std::regex eval("stage '[st]': [^\n]* eval on 3 examples: [^;]*");
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), eval);
         it != std::sregex_iterator(); ++it) {
      eval_lines[i] += std::regex_replace(it->str(), std::regex(" in [0-9.]+ s"), "") + "\n";
    }
  }
  EXPECT_THAT(eval_lines[0], HasSubstr("stage 't'"));
  EXPECT_EQ(eval_lines[0], eval_lines[1]);
  auto again = testing::RunEngine({"run", "--nproc=2", three.string()});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.out, HasSubstr("stage 's': up to date"));
  EXPECT_THAT(again.out, HasSubstr("stage 't': up to date"));
  for (const std::string stage : {"s", "t"}) {
    const std::filesystem::path final_dir = tmp.path() / "three" / stage / "final";
    EXPECT_TRUE(std::filesystem::exists(final_dir / RankFileName(RankFile::kWeights, 1, 2)));
    ExpectSameModel(tmp.path() / "ddp" / stage / "final", final_dir, /*exactly=*/true);
  }
  auto read = [&](const std::filesystem::path& file, const std::vector<std::string>& command) {
    std::vector<std::string> args = command;
    if (command.front() == "eval") {
      args.insert(args.end(), {file.string(), "--stage=s"});
    } else {
      args.insert(args.begin() + 1, file.string() + ":s");
    }
    return testing::RunEngine(args);
  };
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"eval"},
        std::vector<std::string>{"generate", "--prompt=Hello", "--max_new_tokens=6"}}) {
    auto from_ddp = read(ddp, command);
    auto from_three = read(three, command);
    ASSERT_EQ(from_ddp.exit_code, 0) << from_ddp.err;
    ASSERT_EQ(from_three.exit_code, 0) << from_three.err;
    EXPECT_EQ(std::regex_replace(from_ddp.out, std::regex("ddp"), "three"), from_three.out);
  }
  for (const std::string out : {"ddp", "three"}) {
    auto exported =
        read(out == "ddp" ? ddp : three,
             {"export", "--to=" + (tmp.path() / ("hf_" + out)).string(), "--format=hf"});
    ASSERT_EQ(exported.exit_code, 0) << exported.err;
  }
  ExpectSameWeights(tmp.path() / "hf_ddp/model.safetensors",
                    tmp.path() / "hf_three/model.safetensors", /*exactly=*/true);
  const std::filesystem::path final_dir = tmp.path() / "three/s/final";
  auto refused = testing::RunEngine({"generate", final_dir.string(), "--prompt=Hello"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("use the stage, as in `engine generate PIPELINE.pbtxt:s "
                                     "--checkpoint " +
                                     final_dir.string() + "`, or `engine export` it"));
}

TEST(ShardedDataParallelTest, ShardLevelThreeEvaluatesAModelThatGeneratesWithTheWholeModel) {
  // A Llama scored on digit captions generates its answers token by token, outside its blocks
  // (Model::EvaluatesBlockByBlock says so): at level 3 every parameter is whole for that
  // evaluation, as before, and its metrics are DDP's; 3 eval batches over 2 ranks.
  testing::TempDir tmp;
  auto pipeline = [&](const std::string& out, const std::string& strategy) {
    return tmp.Write(
        out + ".pbtxt",
        "output_dir: \"" + out +
            "\"\nstage {\n  name: \"s\"\n  model { plugin: \"llama\" options { "
            "[type.googleapis.com/engine.transformer.LlamaOptions] { hidden_size: 32 "
            "num_hidden_layers: 2 num_attention_heads: 4 num_key_value_heads: 2 } } }\n  data { "
            "plugin: \"digits_captions\" options { "
            "[type.googleapis.com/engine.plugins.DigitsCaptionsOptions] { path: \"" +
            testing::DigitsDataPath().string() +
            "\" } } }\n  precision { plugin: \"fp32\" }\n  schedule { max_steps: 4 batch_size: 8 "
            "eval_batch_size: 150 eval_every_steps: 2 }\n  parallel { device: \"cpu\" " +
            strategy + " }\n}\n");
  };
  std::string evals[2];
  for (int i = 0; i < 2; ++i) {
    auto r = testing::RunEngine({"run", "--nproc=2",
                                 (i == 0 ? pipeline("ddp", "strategy: DDP")
                                         : pipeline("three", "strategy: SHARDED shard_level: 3"))
                                     .string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("3 batches split across the 2 ranks"));
    std::smatch eval;
    ASSERT_TRUE(std::regex_search(r.out, eval, std::regex("eval on 359 examples: [^;]*")));
    evals[i] = eval.str();
  }
  EXPECT_THAT(evals[0], HasSubstr("exact_match"));
  EXPECT_EQ(evals[0], evals[1]);
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
  ExpectSameModel(tmp.path() / "ddp/s/final", tmp.path() / "two/s/final", /*exactly=*/false);
  // Level 3 as level 2, its blocks' first micro-batch gradients kept whole until the second.
  ExpectSameModel(tmp.path() / "ddp/s/final", tmp.path() / "three/s/final", /*exactly=*/false);
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
  std::filesystem::copy(stage / "final", tmp.path() / "reference",
                        std::filesystem::copy_options::recursive);
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
    ExpectSameModel(tmp.path() / "reference", stage / "final",
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

}  // namespace
}  // namespace engine
