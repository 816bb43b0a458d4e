// The stage's intra-op thread count: what the pipeline asks, else the environment, else what the
// BLAS allows, else the cores this process may use shared among the host's ranks.
#include "core/cpu_threads.h"

#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "dist/dist_env.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

CpuThreadFacts EightCores() {
  CpuThreadFacts facts;
  facts.libtorch_default = 1;
  facts.usable_cores = 8;
  return facts;
}

TEST(CpuThreadsTest, ThePipelinesNumThreadsWinsOverEverything) {
  CpuThreadFacts facts = EightCores();
  facts.requested = 3;
  facts.omp_num_threads = true;
  facts.blas_has_own_pool = true;
  facts.local_ranks = 4;
  const CpuThreadPlan plan = ChooseCpuThreads(facts);
  EXPECT_EQ(plan.threads, 3);
  EXPECT_EQ(plan.reason, "parallel.num_threads");
}

TEST(CpuThreadsTest, OmpNumThreadsKeepsWhatLibTorchReadFromIt) {
  CpuThreadFacts facts = EightCores();
  facts.omp_num_threads = true;
  facts.libtorch_default = 5;
  const CpuThreadPlan plan = ChooseCpuThreads(facts);
  EXPECT_EQ(plan.threads, 5);
  EXPECT_EQ(plan.reason, "OMP_NUM_THREADS");
}

TEST(CpuThreadsTest, ABlasWithItsOwnThreadsKeepsLibTorchsDefaultAndSaysWhatToInstall) {
  CpuThreadFacts facts = EightCores();
  facts.blas_has_own_pool = true;
  facts.libtorch_default = 1;
  const CpuThreadPlan plan = ChooseCpuThreads(facts);
  EXPECT_EQ(plan.threads, 1);
  EXPECT_THAT(plan.reason, HasSubstr("libopenblas0-openmp"));
}

TEST(CpuThreadsTest, TakesTheUsableCoresSharedAmongTheHostsRanks) {
  CpuThreadFacts facts = EightCores();
  CpuThreadPlan plan = ChooseCpuThreads(facts);
  EXPECT_EQ(plan.threads, 8);
  EXPECT_EQ(plan.reason, "the 8 cores this process may use");

  facts.local_ranks = 2;
  plan = ChooseCpuThreads(facts);
  EXPECT_EQ(plan.threads, 4);
  EXPECT_EQ(plan.reason, "the 8 cores this process may use, shared by 2 ranks on this host");

  facts.local_ranks = 16;  // more ranks than cores: one thread each, never none
  EXPECT_EQ(ChooseCpuThreads(facts).threads, 1);
}

TEST(CpuThreadsTest, ThisMachinesFactsAreWithinWhatItHas) {
  const CpuThreadFacts facts = ReadCpuThreadFacts(0, 1);
  EXPECT_GE(facts.usable_cores, 1);
  EXPECT_LE(facts.usable_cores,
            static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_GE(facts.libtorch_default, 1);
  EXPECT_EQ(facts.omp_num_threads,
            std::getenv("OMP_NUM_THREADS") != nullptr && *std::getenv("OMP_NUM_THREADS") != '\0');
}

TEST(CpuThreadsTest, ApplyingThePlanSetsLibTorchsThreads) {
  const int before = at::get_num_threads();
  ApplyCpuThreads({2, "test"});
  EXPECT_EQ(at::get_num_threads(), 2);
  ApplyCpuThreads({before, "test"});
  EXPECT_EQ(at::get_num_threads(), before);
}

TEST(DistEnvTest, LocalWorldSizeComesFromTheEnvironmentElseEveryRank) {
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("RANK", "1", 1);
  ::unsetenv("LOCAL_WORLD_SIZE");
  StatusOr<DistEnv> env = ReadDistEnv();
  ASSERT_TRUE(env.ok()) << env.status().message();
  EXPECT_EQ(env->local_world_size, 4);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  env = ReadDistEnv();
  ASSERT_TRUE(env.ok()) << env.status().message();
  EXPECT_EQ(env->local_world_size, 2);
  ::setenv("LOCAL_WORLD_SIZE", "two", 1);
  env = ReadDistEnv();
  EXPECT_FALSE(env.ok());
  EXPECT_THAT(env.status().message(), HasSubstr("LOCAL_WORLD_SIZE='two'"));
  for (const char* name : {"WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE"}) ::unsetenv(name);
}

}  // namespace
}  // namespace engine
