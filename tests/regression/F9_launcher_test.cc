// F9: a multi-process launch where one rank dies left the others hanging in a collective, and
// orphans holding the port and the GPU. `engine run --nproc` stops every rank when one fails,
// exits with that rank's status, leaves no process behind, and names a busy MASTER_PORT.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>

#include "testing/pipelines.h"
#include "testing/same_file.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string DdpPipeline(const std::string& header, int steps = 200,
                        const std::string& model = "hidden_units: 32") {
  return "output_dir: \"out\"\nplugin_path: \"" + std::string(testing::kTestPluginDir) +
         "/signal_callback\"\n" + header +
         testing::DigitsStage("s",
                              "  precision { plugin: \"fp32\" }\n"
                              "  schedule { max_steps: " +
                                  std::to_string(steps) +
                                  " batch_size: 16 }\n"
                                  "  parallel { device: \"cpu\" strategy: DDP }",
                              model);
}

std::vector<pid_t> RankPids(const std::string& err) {
  std::smatch match;
  std::vector<pid_t> pids;
  if (std::regex_search(err, match, std::regex("pids ([0-9]+) ([0-9]+)"))) {
    pids = {std::stoi(match[1]), std::stoi(match[2])};
  }
  return pids;
}

TEST(F9LauncherTest, ARankThatDiesStopsTheOthersAndLeavesNoProcess) {
  testing::TempDir tmp;
  const auto file = tmp.Write("p.pbtxt", DdpPipeline(testing::SignalAt("s", 5, "KILL")));
  auto r = testing::RunEngine({"run", "--nproc=2", file.string()});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_THAT(r.err, HasSubstr("engine run: rank 0 (pid "));
  EXPECT_THAT(r.err, HasSubstr(") was killed by signal 9 (Killed); stopping the other 1 rank"));
  const std::vector<pid_t> pids = RankPids(r.err);
  ASSERT_EQ(pids.size(), 2u) << r.err;
  for (pid_t pid : pids) {
    EXPECT_NE(::kill(pid, 0), 0) << "rank pid " << pid << " is still there";
  }
}

// Ctrl-C reaches the launcher, not the ranks (as when a terminal's user presses it while the
// launcher runs in the background, or `kill -INT` names the launcher's pid). It forwards it; every
// rank stops after the same step, rank 0 writes the checkpoint, all exit 130, and the next run
// resumes to the weights of a run never stopped, bit for bit (dropout draws included).
TEST(F9LauncherTest, CtrlCToTheLauncherStopsEveryRankAndTheRunResumesBitForBit) {
  const std::string model = "hidden_units: 32 dropout: 0.3";
  // Long enough that the forwarded signal arrives well before the end on a busy machine.
  constexpr int kSteps = 200;
  testing::TempDir reference;
  auto r = testing::RunEngine(
      {"run", "--nproc=2", reference.Write("p.pbtxt", DdpPipeline("", kSteps, model)).string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  testing::TempDir tmp;
  const auto file = tmp.Write(
      "p.pbtxt", DdpPipeline(testing::SignalAt("s", 17, "INT", /*to_parent=*/true), kSteps, model));
  r = testing::RunEngine({"run", "--nproc=2", file.string()});
  ASSERT_EQ(r.exit_code, 130) << r.err;
  EXPECT_THAT(r.err, HasSubstr("engine run: forwarding SIGINT (Interrupt) to 2 ranks"));
  // An agreed stop is not a failure: no rank is hurried with SIGTERM while rank 0 saves.
  EXPECT_THAT(r.err, Not(HasSubstr("stopping the other")));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "out/s/final"));
  for (pid_t pid : RankPids(r.err)) {
    EXPECT_NE(::kill(pid, 0), 0) << "rank pid " << pid << " is still there";
  }
  std::smatch match;
  const std::string said = r.out + r.err;
  ASSERT_TRUE(std::regex_search(said, match, std::regex("checkpoint \\S*step-(\\d+)"))) << said;
  const int stopped_after = std::stoi(match[1]);
  EXPECT_GE(stopped_after, 17);
  EXPECT_LT(stopped_after, kSteps);

  r = testing::RunEngine({"run", "--nproc=2", file.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 's': resuming after step " + std::to_string(stopped_after)));
  for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
    testing::ExpectSameSafetensors(reference.path() / "out/s/final" / name,
                                   tmp.path() / "out/s/final" / name);
  }
}

TEST(F9LauncherTest, ABusyMasterPortIsNamed) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t size = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  const std::string port = std::to_string(ntohs(address.sin_port));

  testing::TempDir tmp;
  const auto file = tmp.Write("p.pbtxt", DdpPipeline(""));
  auto r = testing::RunEngine({"run", "--nproc=2", file.string()}, "", {{"MASTER_PORT", port}});
  ::close(fd);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("engine run: MASTER_PORT=" + port + " is in use on 127.0.0.1"));
  EXPECT_THAT(r.err, HasSubstr("unset MASTER_PORT and --nproc picks a free one"));
}

}  // namespace
}  // namespace engine
