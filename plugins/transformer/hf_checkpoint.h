// Reading a Hugging Face-layout model directory into a module: config.json, then the weights from
// model.safetensors or from the shards a model.safetensors.index.json names. Every module tensor
// must be there with its shape; tensors the module lacks are an error (except ones known to be
// derived, such as rotary inv_freq). Tensors keep their stored dtype. Errors name the directory and
// the tensor.
#pragma once

#include <torch/nn/module.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "engine/linear.h"
#include "engine/status.h"

namespace engine::transformer {

StatusOr<nlohmann::json> ReadConfigJson(const std::filesystem::path& dir);

// Called with each engine::Linear of the module right after its weight is read (the
// ModelContext::linear_loaded hook of engine/model.h).
using LinearLoaded = std::function<Status(const std::string& name, LinearImpl& layer)>;

// Loads the directory's weights into `module` by name, one tensor at a time, each straight into
// place. `optional` names may be absent (a tied lm_head).
Status LoadWeights(const std::filesystem::path& dir, torch::nn::Module& module,
                   const std::set<std::string>& optional = {},
                   const LinearLoaded& linear_loaded = {});

}  // namespace engine::transformer
