// Where the training steps' time goes, phase by phase, so that a benchmark can show what the engine
// adds around the model's own forward and backward (bench/train_loop_bench prints it).
//
// Host wall time, read with steady_clock around each phase (two clock reads per phase and
// micro-batch: tens of nanoseconds). On a GPU the phases that only launch kernels look cheap and
// the next one that waits for the device pays for them. Not thread-safe: the trainer's thread only.
#pragma once

#include <chrono>

namespace engine {

struct StepPhaseSeconds {
  double batch = 0;     // taking the next batch from the prefetcher (and moving it to the device)
  double forward = 0;   // the model's forward, loss included, in the precision context
  double backward = 0;  // backward and the loss accumulation over micro-batches
  // The one read of the step's loss, non-finite flag and gradient norm (train/step_scalars.h);
  // on a GPU it also waits for the step's queued work.
  double host_read = 0;
  double update = 0;     // unscaling and the non-finite check, clipping, the optimizer step
  double callbacks = 0;  // the step_end event
};

// Adds the time from its construction to its destruction to one phase's total.
class PhaseTimer {
 public:
  explicit PhaseTimer(double* total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    *total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double* total_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace engine
