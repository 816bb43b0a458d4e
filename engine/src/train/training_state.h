// What a checkpoint's optimizer.safetensors holds beside the optimizer's slots so a stage can go
// on exactly where it stopped: f32 masters ("<name>.master"), the random generators
// ("engine/rng/<device>", a name no parameter can have), and as metadata the optimizer's step
// count, the loss scaler, and the counters behind the step events. Numbers are written with 17
// significant digits, so they read back bit for bit.
//
// Thread safety: GeneratorState/SetGeneratorState take the generator's lock; the rest is plain
// data.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <string>

#include "dist/data_parallel.h"
#include "engine/safetensors.h"
#include "engine/status.h"
#include "train/precision_runtime.h"

namespace engine {

// The seed of a stage's training generators (dropout and other draws) on DDP rank `rank`: rank 0's
// is the single-process seed, every other rank's differs, so ranks draw independent dropout masks.
uint64_t TrainingSeed(uint64_t stage_seed, int rank);

struct TrainingState {
  std::string algorithm;
  int64_t optimizer_steps = 0;
  PrecisionRuntime::ScalerState scaler;
  int64_t examples = 0;
  double last_loss = 0;
  double last_lr = 0;
  // Generator states by device ("cpu", "cuda:0") for rank 0, and under DDP the other ranks' as
  // RankGeneratorKey(r, ...).
  std::map<std::string, at::Tensor> generators;
  // Callbacks' SaveState() by "<runner>/<position>:<name>" (metadata "callback_state/<key>").
  std::map<std::string, std::string> callback_states;
};

// "rank<r>/cpu" and "rank<r>/device" (the rank's own accelerator): other ranks' generators in
// rank 0's checkpoint.
std::string RankGeneratorKey(int rank, bool device);

// Whether optimizer state `name` is an f32 master ("<parameter>.master").
bool IsMasterStateName(const std::string& name);

// Appends the generators to `tensors` (after the optimizer's slots and the masters) and returns
// the file's metadata.
safetensors::Metadata AppendTrainingState(const TrainingState& state,
                                          safetensors::NamedTensors& tensors);

// An optimizer.safetensors taken apart again. Errors (a missing or malformed entry, no CPU
// generator) name what is wrong; the caller adds which file.
struct SavedTrainingState {
  TrainingState state;
  safetensors::NamedTensors optimizer_slots;
  safetensors::NamedTensors masters;
};
StatusOr<SavedTrainingState> ReadTrainingState(const safetensors::File& file);

// The default generator of `device` (the CPU's, or the device's), as a state tensor on the CPU.
at::Tensor GeneratorState(at::Device device);
void SetGeneratorState(at::Device device, const at::Tensor& state);

// Every rank's generator states (the CPU's, and `device`'s when it is not the CPU), gathered on
// every rank, keyed by RankGeneratorKey, for ranks 1 and up. A collective: all ranks call it at
// the same point. Fails when the ranks' states differ in size (another generator type).
StatusOr<std::map<std::string, at::Tensor>> GatherRankGenerators(DataParallel& ranks, int rank,
                                                                 int world_size, at::Device device);

}  // namespace engine
