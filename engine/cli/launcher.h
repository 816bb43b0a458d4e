// `engine run --nproc N`: starts N local ranks of the same command and keeps them in check.
//
// The launcher picks a free MASTER_PORT (or checks the one given), starts each rank with RANK,
// LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in a process group of its own, shows rank 0's
// output and every rank's errors, forwards SIGINT and SIGTERM to all ranks, and when any rank fails
// stops the others (SIGTERM, then SIGKILL after a grace period) and reaps them all, so no rank is
// left behind (F9). Ranks also die with the launcher (PR_SET_PDEATHSIG).
#pragma once

#include <string>
#include <vector>

namespace engine::cli {

// `run_args` are the `engine run` arguments without --nproc. Returns the exit status: 0 when every
// rank succeeded, else the first failing rank's (128 + signal when it was killed).
int LaunchRanks(int nproc, const std::vector<std::string>& run_args);

}  // namespace engine::cli
