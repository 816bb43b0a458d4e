// Reading a Hugging Face-layout model directory into a module: config.json, then the weights from
// model.safetensors or from the shards a model.safetensors.index.json names. Every module tensor
// must be there with its shape; tensors the module lacks are an error (except ones known to be
// derived, such as rotary inv_freq). Tensors keep their stored dtype. Errors name the directory and
// the tensor.
#pragma once

#include <torch/nn/module.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/model.h"
#include "engine/status.h"

namespace engine::transformer {

StatusOr<nlohmann::json> ReadConfigJson(const std::filesystem::path& dir);
// Any JSON file; errors name it.
StatusOr<nlohmann::json> ReadJsonFile(const std::filesystem::path& path);

// Loads the directory's weights into `module` by name, one tensor at a time, each straight into
// place. `optional` names may be absent (a tied lm_head). With a `context`, its linear_loaded hook
// is called for each engine::Linear right after its weight is read, and before anything is read
// the memory the load needs (the tensors, the layers context->quantizes at about 4 bits) is
// compared with what the host has left (engine/host_memory.h): a load that cannot fit is a
// FAILED_PRECONDITION error saying both. With context->plan_only, no values are read: every tensor
// takes its shape and dtype from the files' headers, and the layers the stage quantizes get values
// drawn at random for their quantizer (a bitsandbytes 4-bit weight is still read and dequantized).
// `renames` reads another layout of the same model.
// (checkpoint prefix, module prefix) pairs: a checkpoint tensor whose name starts with the first
// is read into the module's tensor named with the second instead (the first pair that matches).
using PrefixRenames = std::vector<std::pair<std::string, std::string>>;

Status LoadWeights(const std::filesystem::path& dir, torch::nn::Module& module,
                   const std::set<std::string>& optional = {},
                   const ModelContext* context = nullptr, const PrefixRenames& renames = {});

}  // namespace engine::transformer
