// Real c10d Gloo groups inside one test process: each rank a thread of its own, meeting through an
// in-memory store, so collectives run as they do between processes (loopback TCP) without a
// launcher. The including .cc must define USE_C10D_GLOO before any include.
//
// c10d's flight recorder (a process-wide log of collectives, on by default in LibTorch 2.11)
// registers each group in a map outside its lock, so groups started on several threads of one
// process at once crash it now and then; an engine process has one group and never does. It is
// switched off (TORCH_FR_BUFFER_SIZE=0) when the test binary starts, before any group exists.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <functional>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "dist/c10d_group.h"

namespace engine::testing {

inline const bool kFlightRecorderOff = setenv("TORCH_FR_BUFFER_SIZE", "0", 1) == 0;

// Runs body(group) on `world` ranks of one Gloo group, each on a thread of its own; returns when
// all of them have. The threads must not share LibTorch's default generator. `by`: how the group
// reduce-scatters (an engine process's Gloo group all-reduces and slices).
inline void OnRanks(
    int world, const std::function<void(DataParallel&)>& body,
    dist_internal::ReduceScatterBy by = dist_internal::ReduceScatterBy::kAllReduce) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
      dist_internal::C10dDataParallel<c10d::ProcessGroupGloo> ranks(c10::Device(c10::kCPU), store,
                                                                    group, by);
      body(ranks);
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace engine::testing
