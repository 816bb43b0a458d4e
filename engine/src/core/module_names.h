// A layer's or tensor's name as Hugging Face's model class names the module, from the name the
// checkpoint gives it and the model's Model::transformers_module_prefixes (engine/model.h). PEFT's
// files and patterns use those names. Pure function; any thread.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace engine {

// (checkpoint prefix, transformers prefix) pairs; the first that matches applies.
using ModulePrefixes = std::vector<std::pair<std::string, std::string>>;

std::string TransformersModuleName(const std::string& name, const ModulePrefixes& prefixes);

}  // namespace engine
