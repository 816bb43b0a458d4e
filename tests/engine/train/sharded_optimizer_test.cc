// The sharded optimizer on real Gloo groups of 2 and 3 ranks, one thread each, against the plain
// optimizer on one process: buckets of a few elements, so that parameters share and span buckets,
// straddle ranks and leave padding. The updates, the low-precision write-back, the state the ranks
// save in their own files and a resume at another world size are what the plain optimizer gives.
#define USE_C10D_GLOO 1
#include "train/sharded_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "checkpoint/tensor_pieces.h"
#include "testing/gloo_ranks.h"
#include "testing/temp_dir.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

// 41 elements in 6 tensors. 40-byte buckets cut them into 10, 10, 10, 10 and 1 elements, so
// tensors span buckets and ranks; with 3 ranks into 9, 9, 9, 9 and 5 (a full bucket is a multiple
// of the world size), and the last bucket's last slice is padded.
const std::vector<std::vector<int64_t>> kShardedShapes = {{5, 3}, {2}, {3}, {7}, {2, 2, 2}, {11}};
constexpr int64_t kShardedBucketBytes = 40;

// Large enough for LibTorch's vectorized loops, with parts that start mid-vector.
const std::vector<std::vector<int64_t>> kLargeShapes = {{37, 29}, {1000}, {3}, {129}};

// Random tensors of `shapes` from `seed`, the same on every thread (the ranks' threads must not
// share LibTorch's default generator).
std::vector<at::Tensor> RandomTensors(
    uint64_t seed, const std::vector<std::vector<int64_t>>& shapes = kShardedShapes) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> out;
  for (const auto& shape : shapes) out.push_back(at::randn(shape, generator));
  return out;
}

std::vector<NamedParameter> FreshParameters(
    const std::vector<std::vector<int64_t>>& shapes = kShardedShapes) {
  std::vector<NamedParameter> out;
  const std::vector<at::Tensor> values = RandomTensors(7, shapes);
  for (size_t i = 0; i < values.size(); ++i) out.push_back({"p" + std::to_string(i), values[i]});
  return out;
}

// The gradients of step `step`: the same on every rank (as after the all-reduce).
std::vector<at::Tensor> ShardedGradients(
    int step, const std::vector<std::vector<int64_t>>& shapes = kShardedShapes) {
  return RandomTensors(100 + step, shapes);
}

void SetGradients(std::vector<NamedParameter>& parameters, int step) {
  const std::vector<at::Tensor> g = ShardedGradients(step);
  for (size_t i = 0; i < parameters.size(); ++i) parameters[i].tensor.mutable_grad() = g[i];
}

proto::Optimizer AdamWConfig() {
  proto::Optimizer config;
  config.mutable_adamw()->set_weight_decay(0.1);
  return config;
}

proto::Optimizer SgdConfig() {
  proto::Optimizer config;
  config.mutable_sgd()->set_momentum(0.9);
  config.mutable_sgd()->set_nesterov(true);
  return config;
}

using testing::OnRanks;

void ExpectEqual(const std::vector<NamedParameter>& a, const std::vector<NamedParameter>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i].tensor, b[i].tensor))
        << what << ": " << a[i].name << " differs by "
        << (a[i].tensor - b[i].tensor).abs().max().item<double>();
  }
}

void ExpectSameState(const safetensors::NamedTensors& a, const safetensors::NamedTensors& b) {
  std::map<std::string, at::Tensor> x(a.begin(), a.end()), y(b.begin(), b.end());
  ASSERT_EQ(x.size(), y.size());
  for (const auto& [name, tensor] : x) {
    ASSERT_EQ(y.count(name), 1u) << name;
    EXPECT_TRUE(at::equal(tensor, y[name])) << name;
  }
}

// What a checkpoint of a sharded optimizer holds: every rank's StateParts() in its own file. Each
// rank calls Save; Read then opens them all (after OnRanks, which joins the ranks' threads).
class SavedRanks {
 public:
  explicit SavedRanks(int world) : parts_(world) {}
  void Save(const Optimizer& optimizer, int rank) { parts_[rank] = optimizer.StateParts(); }
  TensorPieces Read() const {
    std::vector<std::filesystem::path> files;
    for (size_t r = 0; r < parts_.size(); ++r) {
      files.push_back(dir_.path() / ("rank" + std::to_string(r) + ".safetensors"));
      EXPECT_TRUE(WritePieces(files.back(), parts_[r]).ok());
    }
    auto opened = TensorPieces::Open(files);
    EXPECT_TRUE(opened.ok()) << opened.status().message();
    return opened.ok() ? std::move(*opened) : TensorPieces();
  }
  // The whole state, by name.
  safetensors::NamedTensors Whole() const {
    const TensorPieces pieces = Read();
    safetensors::NamedTensors out;
    for (const std::string& name : pieces.names()) out.emplace_back(name, *pieces.Whole(name));
    return out;
  }

 private:
  std::vector<PiecesToWrite> parts_;
  testing::TempDir dir_;
};

// The plain optimizer after `steps` steps, its parameters and state.
struct ShardedReference {
  std::vector<NamedParameter> parameters = FreshParameters();
  std::unique_ptr<Optimizer> optimizer;
  ShardedReference(const proto::Optimizer& config, int steps) {
    optimizer = MakeOptimizer(config, parameters);
    for (int s = 0; s < steps; ++s) {
      SetGradients(parameters, s);
      optimizer->Step(1e-2);
    }
  }
};

std::unique_ptr<Optimizer> Sharded(const proto::Optimizer& config,
                                   std::vector<NamedParameter> parameters, DataParallel* group,
                                   int64_t bucket_bytes) {
  auto made = MakeShardedOptimizer(config, std::move(parameters), {}, group, bucket_bytes);
  EXPECT_TRUE(made.ok()) << made.status().message();
  return made.ok() ? std::move(*made) : nullptr;
}

class ShardedOptimizerTest : public ::testing::TestWithParam<int> {};

TEST_P(ShardedOptimizerTest, EveryRankEndsWithThePlainOptimizersWeightsAndState) {
  const int world = GetParam();
  for (const proto::Optimizer& config : {AdamWConfig(), SgdConfig()}) {
    const ShardedReference reference(config, 3);
    SavedRanks files(world);
    OnRanks(world, [&](DataParallel& ranks) {
      std::vector<NamedParameter> parameters = FreshParameters();
      auto sharded = Sharded(config, parameters, &ranks, kShardedBucketBytes);
      for (int s = 0; s < 3; ++s) {
        SetGradients(parameters, s);
        sharded->Step(1e-2);
      }
      ExpectEqual(parameters, reference.parameters, "rank " + std::to_string(ranks.rank()));
      EXPECT_TRUE(sharded->State().empty()) << "no rank holds the whole state";
      EXPECT_TRUE(sharded->sharded());
      EXPECT_EQ(sharded->steps(), 3);
      files.Save(*sharded, ranks.rank());
    });
    ExpectSameState(files.Whole(), reference.optimizer->State());
  }
}

TEST_P(ShardedOptimizerTest, ScaledLowPrecisionGradientsUpdateMastersAndWriteBack) {
  // As the precision runtime feeds it: bf16 gradients still to be multiplied by 1/1024, f32
  // masters, and bf16 weights that receive the update.
  const int world = GetParam();
  auto feeds_for = [](int step, const std::vector<at::Tensor>& low) {
    const std::vector<at::Tensor> g = ShardedGradients(step);
    std::vector<GradientFeed> feeds;
    for (size_t i = 0; i < g.size(); ++i) {
      feeds.push_back({g[i].mul(1024).to(at::kBFloat16), 1.0 / 1024, low[i]});
    }
    return feeds;
  };
  std::vector<NamedParameter> masters = FreshParameters();
  std::vector<at::Tensor> low;
  for (const auto& m : masters) low.push_back(m.tensor.to(at::kBFloat16));
  auto plain = MakeOptimizer(AdamWConfig(), masters);
  for (int s = 0; s < 2; ++s) plain->Step(1e-2, feeds_for(s, low));
  OnRanks(world, [&](DataParallel& ranks) {
    std::vector<NamedParameter> mine = FreshParameters();
    std::vector<at::Tensor> my_low;
    for (const auto& m : mine) my_low.push_back(m.tensor.to(at::kBFloat16));
    auto sharded = Sharded(AdamWConfig(), mine, &ranks, kShardedBucketBytes);
    for (int s = 0; s < 2; ++s) sharded->Step(1e-2, feeds_for(s, my_low));
    // The same fused pass on views of the same elements: bit for bit.
    for (size_t i = 0; i < mine.size(); ++i) {
      EXPECT_TRUE(at::equal(mine[i].tensor, masters[i].tensor)) << mine[i].name;
      EXPECT_TRUE(at::equal(my_low[i], low[i])) << mine[i].name;
    }
  });
}

TEST_P(ShardedOptimizerTest, MastersItKeepsForItsPartsEndWhereTheRuntimesMastersEnd) {
  // A bf16 stage whose precision runtime leaves the masters to the optimizer: the optimizer gets
  // the bf16 parameters, keeps f32 masters for its parts and writes the rounded update back. The
  // bf16 weights, the moments and the gathered masters are those of the plain optimizer on whole
  // f32 masters, bit for bit; the state resumes on another world size.
  const int world = GetParam();
  const std::vector<at::ScalarType> f32(kShardedShapes.size(), at::kFloat);
  auto bf16_parameters = [] {
    std::vector<NamedParameter> out = FreshParameters();
    for (auto& p : out) p.tensor = p.tensor.to(at::kBFloat16);
    return out;
  };
  auto feeds_for = [](int step, const std::vector<NamedParameter>& low) {
    const std::vector<at::Tensor> g = ShardedGradients(step);
    std::vector<GradientFeed> feeds;
    for (size_t i = 0; i < g.size(); ++i) {
      feeds.push_back({g[i].mul(512).to(at::kBFloat16), 1.0 / 512, low[i].tensor});
    }
    return feeds;
  };
  // The plain optimizer on the precision runtime's whole masters.
  const std::vector<NamedParameter> low = bf16_parameters();
  std::vector<NamedParameter> masters;
  for (const auto& p : low) masters.push_back({p.name, p.tensor.to(at::kFloat)});
  auto plain = MakeOptimizer(AdamWConfig(), masters);
  for (int s = 0; s < 2; ++s) plain->Step(1e-2, feeds_for(s, low));
  safetensors::NamedTensors expected = plain->State();
  for (const auto& m : masters) expected.emplace_back(m.name + ".master", m.tensor);
  SavedRanks files(world);
  OnRanks(world, [&](DataParallel& ranks) {
    std::vector<NamedParameter> mine = bf16_parameters();
    auto made = MakeShardedOptimizer(AdamWConfig(), mine, f32, &ranks, kShardedBucketBytes);
    ASSERT_TRUE(made.ok());
    for (int s = 0; s < 2; ++s) (*made)->Step(1e-2, feeds_for(s, mine));
    ExpectEqual(mine, low, "bf16 weights");
    files.Save(**made, ranks.rank());
  });
  ExpectSameState(files.Whole(), expected);
  const TensorPieces saved = files.Read();
  // One more step, resumed on 2 ranks from what was gathered.
  plain->Step(1e-2, feeds_for(2, low));
  OnRanks(2, [&](DataParallel& ranks) {
    std::vector<NamedParameter> mine = bf16_parameters();
    auto made = MakeShardedOptimizer(AdamWConfig(), mine, f32, &ranks, kShardedBucketBytes);
    ASSERT_TRUE(made.ok());
    ASSERT_TRUE((*made)->LoadStatePieces(saved, 2).ok());
    (*made)->Step(1e-2, feeds_for(2, mine));
    // The step starts from the saved masters, not from the bf16 weights it was made with.
    ExpectEqual(mine, low, "bf16 weights after the resumed step");
  });
}

TEST_P(ShardedOptimizerTest, AdamWOnLargeTensorsIsBitForBitAndSgdWithinOneRounding) {
  // The fused AdamW pass computes each element alike wherever it falls, so parts that start
  // mid-vector change nothing; SGD runs LibTorch's vectorized kernels, whose fused multiply-adds
  // and scalar tails may round an element's last bit differently (1e-6 relative after 3 steps).
  const int world = GetParam();
  for (const bool adamw : {true, false}) {
    std::vector<NamedParameter> reference = FreshParameters(kLargeShapes);
    auto plain = MakeOptimizer(adamw ? AdamWConfig() : SgdConfig(), reference);
    for (int s = 0; s < 3; ++s) {
      const std::vector<at::Tensor> g = ShardedGradients(s, kLargeShapes);
      for (size_t i = 0; i < g.size(); ++i) reference[i].tensor.mutable_grad() = g[i];
      plain->Step(1e-2);
    }
    OnRanks(world, [&](DataParallel& ranks) {
      std::vector<NamedParameter> parameters = FreshParameters(kLargeShapes);
      auto sharded =
          Sharded(adamw ? AdamWConfig() : SgdConfig(), parameters, &ranks, /*bucket_bytes=*/4000);
      for (int s = 0; s < 3; ++s) {
        const std::vector<at::Tensor> g = ShardedGradients(s, kLargeShapes);
        for (size_t i = 0; i < g.size(); ++i) parameters[i].tensor.mutable_grad() = g[i];
        sharded->Step(1e-2);
      }
      if (adamw) {
        ExpectEqual(parameters, reference, "AdamW");
        return;
      }
      for (size_t i = 0; i < parameters.size(); ++i) {
        EXPECT_TRUE(at::allclose(parameters[i].tensor, reference[i].tensor, 1e-6, 1e-7))
            << "SGD: " << parameters[i].name;
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShardedOptimizerTest, ::testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "Ranks"; });

TEST(ShardedOptimizerResumeTest, StateSavedByTwoRanksResumesOnThreeAndOnOne) {
  // Two steps on 2 ranks, each writing its parts as a checkpoint holds them, then one more step on
  // 3 ranks (each reading its parts across both files) and on one plain optimizer: both end where
  // three uninterrupted plain steps end.
  const ShardedReference reference(AdamWConfig(), 3);
  SavedRanks files(2);
  std::vector<NamedParameter> after_two;
  OnRanks(2, [&](DataParallel& ranks) {
    std::vector<NamedParameter> parameters = FreshParameters();
    auto sharded = Sharded(AdamWConfig(), parameters, &ranks, kShardedBucketBytes);
    for (int s = 0; s < 2; ++s) {
      SetGradients(parameters, s);
      sharded->Step(1e-2);
    }
    files.Save(*sharded, ranks.rank());
    if (ranks.rank() == 0) {
      for (const auto& p : parameters) after_two.push_back({p.name, p.tensor.clone()});
    }
  });
  const TensorPieces saved = files.Read();
  ASSERT_FALSE(saved.names().empty());
  auto copy = [&] {
    std::vector<NamedParameter> out;
    for (const auto& p : after_two) out.push_back({p.name, p.tensor.clone()});
    return out;
  };
  OnRanks(3, [&](DataParallel& ranks) {
    std::vector<NamedParameter> parameters = copy();
    auto sharded = Sharded(AdamWConfig(), parameters, &ranks, kShardedBucketBytes);
    ASSERT_TRUE(sharded->LoadStatePieces(saved, 2).ok());
    SetGradients(parameters, 2);
    sharded->Step(1e-2);
    ExpectEqual(parameters, reference.parameters, "resumed on 3 ranks");
  });
  std::vector<NamedParameter> parameters = copy();
  auto plain = MakeOptimizer(AdamWConfig(), parameters);
  ASSERT_TRUE(plain->LoadStatePieces(saved, 2).ok());
  SetGradients(parameters, 2);
  plain->Step(1e-2);
  ExpectEqual(parameters, reference.parameters, "resumed on one plain optimizer");
}

TEST(ShardedOptimizerResumeTest, RefusesParametersItCannotUpdateInPlace) {
  OnRanks(2, [&](DataParallel& ranks) {
    std::vector<NamedParameter> parameters = {{"transposed", at::randn({3, 4}).t()}};
    auto made = MakeShardedOptimizer(AdamWConfig(), parameters, {}, &ranks, kShardedBucketBytes);
    ASSERT_FALSE(made.ok());
    EXPECT_THAT(made.status().message(), HasSubstr("'transposed'"));
    EXPECT_THAT(made.status().message(), HasSubstr("not contiguous"));
  });
}

TEST(ShardedOptimizerResumeTest, AStateSavedBeforeAnyUpdateHoldsTheMasters) {
  // Steps skipped for overflow leave no slots, but a checkpoint then must still hold the masters
  // that DDP's precision runtime would write.
  std::vector<NamedParameter> parameters = FreshParameters();
  for (auto& p : parameters) p.tensor = p.tensor.to(at::kBFloat16);
  SavedRanks files(2);
  OnRanks(2, [&](DataParallel& ranks) {
    std::vector<NamedParameter> mine = FreshParameters();
    for (auto& p : mine) p.tensor = p.tensor.to(at::kBFloat16);
    auto made = MakeShardedOptimizer(AdamWConfig(), mine,
                                     std::vector<at::ScalarType>(kShardedShapes.size(), at::kFloat),
                                     &ranks, kShardedBucketBytes);
    ASSERT_TRUE(made.ok());
    files.Save(**made, ranks.rank());
  });
  const safetensors::NamedTensors state = files.Whole();
  ASSERT_EQ(state.size(), parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_EQ(state[i].first, parameters[i].name + ".master");
    EXPECT_TRUE(at::equal(state[i].second, parameters[i].tensor.to(at::kFloat)));
  }
}

TEST(ShardedOptimizerResumeTest, AParameterWithoutElementsKeepsItsStateInTheCheckpoint) {
  // No rank owns a part of it, so rank 0 writes its empty pieces: the state names it, with its
  // shape and master, as the plain optimizer's does, and a resume finds what it expects.
  auto parameters = [] {
    std::vector<NamedParameter> out = {{"empty", at::zeros({0, 3}, at::kBFloat16)},
                                       {"w", at::randn({5}).to(at::kBFloat16)}};
    out[0].tensor.mutable_grad() = at::zeros({0, 3}, at::kBFloat16);
    out[1].tensor.mutable_grad() = at::ones({5}, at::kBFloat16);
    return out;
  };
  const std::vector<at::ScalarType> f32(2, at::kFloat);
  SavedRanks files(2);
  OnRanks(2, [&](DataParallel& ranks) {
    std::vector<NamedParameter> mine = parameters();
    auto made = MakeShardedOptimizer(AdamWConfig(), mine, f32, &ranks, kShardedBucketBytes);
    ASSERT_TRUE(made.ok());
    (*made)->Step(1e-2);
    files.Save(**made, ranks.rank());
  });
  const TensorPieces saved = files.Read();
  for (const std::string name : {"empty.exp_avg", "empty.exp_avg_sq", "empty.master"}) {
    ASSERT_TRUE(saved.Has(name)) << name;
    EXPECT_EQ(saved.shape(name), (std::vector<int64_t>{0, 3})) << name;
  }
  OnRanks(2, [&](DataParallel& ranks) {
    std::vector<NamedParameter> mine = parameters();
    auto made = MakeShardedOptimizer(AdamWConfig(), mine, f32, &ranks, kShardedBucketBytes);
    ASSERT_TRUE(made.ok());
    const Status loaded = (*made)->LoadStatePieces(saved, 1);
    EXPECT_TRUE(loaded.ok()) << loaded.message();
  });
}

TEST(ShardedOptimizerResumeTest, RefusesStateThatFitsNoParameter) {
  OnRanks(2, [&](DataParallel& ranks) {
    std::vector<NamedParameter> parameters = FreshParameters();
    auto sharded = Sharded(AdamWConfig(), parameters, &ranks, kShardedBucketBytes);
    Status wrong_shape = sharded->LoadState(
        {{"p0.exp_avg", at::zeros({3, 5})}, {"p0.exp_avg_sq", at::zeros({5, 3})}}, 1);
    EXPECT_THAT(wrong_shape.message(), HasSubstr("'p0.exp_avg' has the wrong shape"));
    Status stranger = sharded->LoadState({{"q.exp_avg", at::zeros({1})}}, 1);
    EXPECT_THAT(stranger.message(), HasSubstr("'q.exp_avg', which matches no trainable parameter"));
    Status half = sharded->LoadState({{"p1.exp_avg", at::zeros({2})}}, 1);
    EXPECT_THAT(half.message(), HasSubstr("'p1' lacks one of its slots"));
    Status master = sharded->LoadState({{"p1.master", at::zeros({2})}}, 1);
    EXPECT_THAT(master.message(), HasSubstr("'p1.master', which matches no trainable parameter"))
        << "these parameters have no masters";
  });
}

}  // namespace
}  // namespace engine
