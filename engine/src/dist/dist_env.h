// Which rank this process is, from the variables torchrun, Slurm scripts and `engine run --nproc`
// set: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. None set means one rank.
#pragma once

#include <string>

#include "engine/status.h"

namespace engine {

struct DistEnv {
  bool from_environment = false;  // WORLD_SIZE was set
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // Ranks on this host: LOCAL_WORLD_SIZE (torchrun, `engine run --nproc`), else every rank.
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// An error names the variable and its value when one is malformed or they contradict each other.
StatusOr<DistEnv> ReadDistEnv();

}  // namespace engine
