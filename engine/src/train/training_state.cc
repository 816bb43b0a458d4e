#include "train/training_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/ops/empty.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace engine {
namespace {

constexpr const char* kRngPrefix = "engine/rng/";
constexpr const char* kCallbackStatePrefix = "callback_state/";

std::string PrintExactly(double value) {
  char text[40];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

StatusOr<int64_t> IntegerMetadata(const safetensors::Metadata& metadata, const std::string& key) {
  auto it = metadata.find(key);
  if (it == metadata.end()) return DataLossError("the optimizer file lacks '" + key + "'");
  char* end = nullptr;
  const long long value = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0') {
    return DataLossError("the optimizer file's '" + key + "' is not an integer");
  }
  return static_cast<int64_t>(value);
}

StatusOr<double> NumberMetadata(const safetensors::Metadata& metadata, const std::string& key) {
  auto it = metadata.find(key);
  if (it == metadata.end()) return DataLossError("the optimizer file lacks '" + key + "'");
  char* end = nullptr;
  const double value = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0') {
    return DataLossError("the optimizer file's '" + key + "' is not a number");
  }
  return value;
}

at::Generator DefaultGenerator(at::Device device) {
  return device.is_cpu() ? at::detail::getDefaultCPUGenerator()
                         : at::globalContext().defaultGenerator(device);
}

}  // namespace

uint64_t TrainingSeed(uint64_t stage_seed, int rank) {
  return (stage_seed ^ 0x5452414953454544ULL) + static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ULL;
}

bool IsMasterStateName(const std::string& name) {
  static const std::string kMaster = ".master";
  return name.size() > kMaster.size() &&
         name.compare(name.size() - kMaster.size(), kMaster.size(), kMaster) == 0;
}

std::string RankGeneratorKey(int rank, bool device) {
  return "rank" + std::to_string(rank) + (device ? "/device" : "/cpu");
}

safetensors::Metadata AppendTrainingState(const TrainingState& state,
                                          safetensors::NamedTensors& tensors) {
  for (const auto& [device, generator] : state.generators) {
    tensors.emplace_back(std::string(kRngPrefix) + device, generator);
  }
  safetensors::Metadata metadata = {
      {"algorithm", state.algorithm},
      {"step", std::to_string(state.optimizer_steps)},
      {"loss_scale", PrintExactly(state.scaler.scale)},
      {"growth_tracker", std::to_string(state.scaler.growth_tracker)},
      {"skipped_steps", std::to_string(state.scaler.skipped_steps)},
      {"consecutive_skipped_steps", std::to_string(state.scaler.consecutive_skipped_steps)},
      {"examples", std::to_string(state.examples)},
      {"last_loss", PrintExactly(state.last_loss)},
      {"last_lr", PrintExactly(state.last_lr)}};
  for (const auto& [key, value] : state.callback_states) {
    metadata[kCallbackStatePrefix + key] = value;
  }
  return metadata;
}

StatusOr<SavedTrainingState> ReadTrainingState(const safetensors::File& file) {
  SavedTrainingState saved;
  ENGINE_ASSIGN_OR_RETURN(safetensors::NamedTensors all, file.GetAll());
  for (auto& [name, tensor] : all) {
    if (name.rfind(kRngPrefix, 0) == 0) {
      saved.state.generators[name.substr(std::strlen(kRngPrefix))] = tensor.clone();
    } else if (IsMasterStateName(name)) {
      saved.masters.emplace_back(name, tensor);
    } else {
      saved.optimizer_slots.emplace_back(name, tensor);
    }
  }
  const safetensors::Metadata& meta = file.metadata();
  TrainingState& s = saved.state;
  if (auto it = meta.find("algorithm"); it != meta.end()) s.algorithm = it->second;
  ENGINE_ASSIGN_OR_RETURN(s.optimizer_steps, IntegerMetadata(meta, "step"));
  ENGINE_ASSIGN_OR_RETURN(s.scaler.scale, NumberMetadata(meta, "loss_scale"));
  ENGINE_ASSIGN_OR_RETURN(s.scaler.growth_tracker, IntegerMetadata(meta, "growth_tracker"));
  ENGINE_ASSIGN_OR_RETURN(s.scaler.skipped_steps, IntegerMetadata(meta, "skipped_steps"));
  ENGINE_ASSIGN_OR_RETURN(s.scaler.consecutive_skipped_steps,
                          IntegerMetadata(meta, "consecutive_skipped_steps"));
  ENGINE_ASSIGN_OR_RETURN(s.examples, IntegerMetadata(meta, "examples"));
  ENGINE_ASSIGN_OR_RETURN(s.last_loss, NumberMetadata(meta, "last_loss"));
  ENGINE_ASSIGN_OR_RETURN(s.last_lr, NumberMetadata(meta, "last_lr"));
  for (const auto& [key, value] : meta) {
    if (key.rfind(kCallbackStatePrefix, 0) == 0) {
      s.callback_states[key.substr(std::strlen(kCallbackStatePrefix))] = value;
    }
  }
  if (s.generators.count("cpu") == 0) {
    return DataLossError("the optimizer file lacks the random generator's state");
  }
  return saved;
}

at::Tensor GeneratorState(at::Device device) {
  at::Generator generator = DefaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state().cpu();
}

void SetGeneratorState(at::Device device, const at::Tensor& state) {
  at::Generator generator = DefaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

StatusOr<std::map<std::string, at::Tensor>> GatherRankGenerators(DataParallel& ranks, int rank,
                                                                 int world_size,
                                                                 at::Device device) {
  std::vector<at::Tensor> mine = {GeneratorState(at::Device(at::kCPU))};
  if (!device.is_cpu()) mine.push_back(GeneratorState(device));
  // Each rank writes its bytes into its own slot of a zeroed vector; the sum is every rank's.
  std::vector<double> lengths(static_cast<size_t>(world_size) * mine.size(), 0.0);
  for (size_t g = 0; g < mine.size(); ++g) {
    lengths[static_cast<size_t>(rank) * mine.size() + g] = static_cast<double>(mine[g].numel());
  }
  ENGINE_ASSIGN_OR_RETURN(std::vector<double> all_lengths, ranks.Max(lengths));
  int64_t slot = 0;
  for (size_t g = 0; g < mine.size(); ++g) slot += mine[g].numel();
  for (int r = 0; r < world_size; ++r) {
    for (size_t g = 0; g < mine.size(); ++g) {
      if (all_lengths[static_cast<size_t>(r) * mine.size() + g] != mine[g].numel()) {
        return FailedPreconditionError(
            "rank " + std::to_string(r) + "'s random generator state has another size than rank " +
            std::to_string(rank) + "'s; the ranks run different generators");
      }
    }
  }
  std::vector<double> bytes(static_cast<size_t>(world_size * slot), 0.0);
  int64_t at = rank * slot;
  for (const at::Tensor& state : mine) {
    const at::Tensor flat = state.contiguous();
    const uint8_t* data = flat.data_ptr<uint8_t>();
    for (int64_t i = 0; i < flat.numel(); ++i) bytes[at++] = data[i];
  }
  ENGINE_ASSIGN_OR_RETURN(std::vector<double> all, ranks.Sum(bytes));
  std::map<std::string, at::Tensor> out;
  for (int r = 1; r < world_size; ++r) {
    int64_t offset = r * slot;
    for (size_t g = 0; g < mine.size(); ++g) {
      at::Tensor state = at::empty({mine[g].numel()}, at::kByte);
      uint8_t* data = state.data_ptr<uint8_t>();
      for (int64_t i = 0; i < state.numel(); ++i) data[i] = static_cast<uint8_t>(all[offset++]);
      out[RankGeneratorKey(r, /*device=*/g > 0)] = state;
    }
  }
  return out;
}

}  // namespace engine
